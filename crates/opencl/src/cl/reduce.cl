// Reductions, softmax and the norms: 16 lanes per row. The summation order (docs/OPS.md)
// puts element j of a row into accumulator j mod 16, in order, then folds the 16 as a tree;
// here work item `lane` of a row IS accumulator `lane`: it visits elements lane, lane + 16,
// lane + 32, … in increasing order with the same adds, and the 16 partial sums meet in local
// memory, where `fold_lanes` combines them exactly as the reference does. So every sum has the
// reference's bits, and a row is read by 16 items at once (consecutive elements by
// consecutive items when the row is contiguous).
//
// The other combinations are order-free or made so: `max`/`min` (NaN absorbs, +0 beats -0)
// are associative and commutative, so the lanes' maxima combine in any order; argmax/argmin
// keep, per lane, the first extreme (the first NaN, or the first strictly better value), and
// the lanes' candidates combine by (NaN first, then value, then the smaller index), which is
// the reference's "first extreme element" over the whole row; integer sums wrap.
//
// A work group holds ROWS rows (defined by `kernels.rs` from the device's largest group) of
// LANES items each; `lanes_fast` lays lanes out adjacent (a row's elements are adjacent in
// memory) or rows adjacent (reductions along a strided axis, whose neighbouring rows are
// adjacent). Groups walk blocks of ROWS rows in a grid-stride loop; the loop is uniform across
// a group, so every item reaches every barrier. Local partials alternate between two buffers
// by iteration, so the next block's writes never race this block's reads with one barrier.

#define GROUP (LANES * ROWS)

// This item's lane and row slot in its work group.
void lane_slot(int lanes_fast, uint* lane, uint* slot) {
    uint lid = get_local_id(0);
    if (lanes_fast) {
        *lane = lid % LANES;
        *slot = lid / LANES;
    } else {
        *lane = lid / ROWS;
        *slot = lid % ROWS;
    }
}

#define FOR_ROW_BLOCKS(it, r0, rows)                                                           \
    for (ulong r0 = get_group_id(0) * ROWS, it = 0; r0 < (rows);                              \
         r0 += get_num_groups(0) * ROWS, it ^= 1)

// The offset of element j (row-major over the reduced axes) from its row's base. `rm`:
// [rank, dims..., strides...] (size-1 axes dropped and contiguous runs merged by the planner).
ulong red_offset(global const long* rm, int rr, ulong j) {
    if (rr == 1) return j * (ulong)rm[2];
    ulong off = 0;
    for (int d = rr - 1; d >= 0; --d) {
        ulong dim = (ulong)rm[1 + d];
        off += (j % dim) * (ulong)rm[1 + rr + d];
        j /= dim;
    }
    return off;
}

// The summation order's fold over one row's 16 lane sums in local memory.
float fold_local(local const float* part) {
    float acc[LANES];
    for (int l = 0; l < LANES; ++l) acc[l] = part[l];
    return fold_lanes(acc);
}

// Whether argmax/argmin's candidate (v, i) beats (best, bi): NaN is the extreme, then the
// strictly better value, and among equals (NaNs, or values equal as numbers, -0 == +0) the
// smaller index, that is the earlier element.
bool arg_beats_f(int op, float v, ulong i, float best, ulong bi) {
    bool vn = tn_is_nan(v), bn = tn_is_nan(best);
    if (bn) return vn && i < bi;
    if (vn) return true;
    if (op == R_ARGMAX ? v > best : v < best) return true;
    return v == best && i < bi;
}

bool arg_beats_i(int op, long v, ulong i, long best, ulong bi) {
    if (op == R_ARGMAX ? v > best : v < best) return true;
    return v == best && i < bi;
}

// meta + mk: the kept positions as a one-operand view over the output shape; meta + mr: the
// reduced axes as [rank, dims..., strides...]. `odt` is the result's dtype.
kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void k_reduce(global uchar* out, global const uchar* x, ulong nout, ulong nred, int op, int dt,
              int odt, global const long* meta, uint mk, uint mr, int lanes_fast) {
    local float pf[2][ROWS][LANES];
    local long pi[2][ROWS][LANES];
    local ulong pj[2][ROWS][LANES];
    global const long* rm = meta + mr;
    const int rr = (int)rm[0];
    uint lane, slot;
    lane_slot(lanes_fast, &lane, &slot);
    const uint used = nred < LANES ? (uint)nred : LANES; // lanes with at least one element
    const bool sum = op == R_SUM || op == R_MEAN;
    const bool arg = op == R_ARGMAX || op == R_ARGMIN;
    FOR_ROW_BLOCKS(it, r0, nout) {
        const ulong o = r0 + slot;
        const bool live = o < nout;
        ulong base = 0;
        if (live) view_offsets(meta + mk, o, 1, &base);
        ulong besti = lane;
        if (is_float_dt(dt)) {
            float acc = 0.0f, best = 0.0f;
            if (live) {
                for (ulong j = lane; j < nred; j += LANES) {
                    float v = ld_f(x, dt, base + red_offset(rm, rr, j));
                    if (sum) acc = acc + v;
                    else if (j == lane) best = v;
                    else if (op == R_REDUCE_MAX) best = tn_fmax(best, v);
                    else if (op == R_REDUCE_MIN) best = tn_fmin(best, v);
                    else if (!tn_is_nan(best) &&
                             (tn_is_nan(v) || (op == R_ARGMAX ? v > best : v < best))) {
                        best = v;
                        besti = j;
                    }
                }
            }
            pf[it][slot][lane] = sum ? acc : best;
        } else {
            ulong acc = 0;
            long best = 0;
            if (live) {
                for (ulong j = lane; j < nred; j += LANES) {
                    long v = ld_i(x, dt, base + red_offset(rm, rr, j));
                    if (sum) acc += (ulong)v;
                    else if (j == lane) best = v;
                    else if (op == R_REDUCE_MAX) best = v > best ? v : best;
                    else if (op == R_REDUCE_MIN) best = v < best ? v : best;
                    else if (op == R_ARGMAX ? v > best : v < best) {
                        best = v;
                        besti = j;
                    }
                }
            }
            pi[it][slot][lane] = sum ? as_long(acc) : best;
        }
        pj[it][slot][lane] = besti;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (live && lane == 0) {
            if (is_float_dt(dt)) {
                local const float* p = pf[it][slot];
                if (sum) {
                    float s = fold_local(p);
                    st_f(out, odt, o, op == R_MEAN ? s / convert_float_rte(nred) : s);
                } else if (arg) {
                    float best = p[0];
                    ulong bi = pj[it][slot][0];
                    for (uint l = 1; l < used; ++l) {
                        if (arg_beats_f(op, p[l], pj[it][slot][l], best, bi)) {
                            best = p[l];
                            bi = pj[it][slot][l];
                        }
                    }
                    st_i(out, odt, o, (long)bi);
                } else {
                    float best = p[0];
                    for (uint l = 1; l < used; ++l)
                        best = op == R_REDUCE_MAX ? tn_fmax(best, p[l]) : tn_fmin(best, p[l]);
                    st_f(out, odt, o, best);
                }
            } else {
                local const long* p = pi[it][slot];
                if (sum) {
                    ulong s = 0;
                    for (uint l = 0; l < LANES; ++l) s += (ulong)p[l];
                    st_i(out, odt, o, as_long(s));
                } else if (arg) {
                    long best = p[0];
                    ulong bi = pj[it][slot][0];
                    for (uint l = 1; l < used; ++l) {
                        if (arg_beats_i(op, p[l], pj[it][slot][l], best, bi)) {
                            best = p[l];
                            bi = pj[it][slot][l];
                        }
                    }
                    st_i(out, odt, o, (long)bi);
                } else {
                    long best = p[0];
                    for (uint l = 1; l < used; ++l)
                        best = op == R_REDUCE_MAX ? (p[l] > best ? p[l] : best)
                                                  : (p[l] < best ? p[l] : best);
                    st_i(out, odt, o, best);
                }
            }
        }
    }
}

// Softmax or log-softmax along one axis of length `len` and element stride `stride`; meta +
// mk: the rows' base offsets as a one-operand view. Three passes over the row, each split
// across its 16 lanes: the maximum (order-free), the sum of exp(x - m) in the summation
// order, then the outputs. Recomputing exp(x - m) in the last pass gives the bits the
// reference stores, without scratch.
kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void k_softmax(global uchar* out, global const uchar* x, ulong rows, ulong len, ulong stride,
               int op, int dt, global const long* meta, uint mk, int lanes_fast) {
    local float pmax[ROWS][LANES];
    local float psum[ROWS][LANES];
    uint lane, slot;
    lane_slot(lanes_fast, &lane, &slot);
    const uint used = len < LANES ? (uint)len : LANES;
    FOR_ROW_BLOCKS(it, r0, rows) {
        const ulong r = r0 + slot;
        const bool live = r < rows && len > 0;
        ulong base = 0;
        if (live) view_offsets(meta + mk, r, 1, &base);
        float m = 0.0f;
        if (live && lane < len) {
            m = ld_f(x, dt, base + lane * stride);
            for (ulong j = lane + LANES; j < len; j += LANES)
                m = tn_fmax(m, ld_f(x, dt, base + j * stride));
        }
        pmax[slot][lane] = m;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (live) {
            m = pmax[slot][0];
            for (uint l = 1; l < used; ++l) m = tn_fmax(m, pmax[slot][l]);
        }
        float acc = 0.0f;
        if (live) {
            for (ulong j = lane; j < len; j += LANES)
                acc = acc + tn_exp(ld_f(x, dt, base + j * stride) - m);
        }
        psum[slot][lane] = acc;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!live) continue;
        const float s = fold_local(psum[slot]);
        if (op == N_SOFTMAX) {
            for (ulong j = lane; j < len; j += LANES) {
                ulong at = base + j * stride;
                st_f(out, dt, at, tn_exp(ld_f(x, dt, at) - m) / s);
            }
        } else {
            const float ls = tn_log(s);
            for (ulong j = lane; j < len; j += LANES) {
                ulong at = base + j * stride;
                st_f(out, dt, at, (ld_f(x, dt, at) - m) - ls);
            }
        }
    }
}

// Layer norm over contiguous rows of `n` elements; gamma and beta optional. The mean's sum
// and the variance's sum of squared deviations each in the summation order, across lanes.
kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void k_layer_norm(global uchar* out, global const uchar* x, global const uchar* g,
                  global const uchar* b, ulong rows, ulong n, int has_g, int has_b,
                  uint eps_bits, int dt) {
    local float psum[ROWS][LANES];
    local float psq[ROWS][LANES];
    uint lane, slot;
    lane_slot(1, &lane, &slot);
    const float eps = as_float(eps_bits);
    const float nf = convert_float_rte(n);
    FOR_ROW_BLOCKS(it, r0, rows) {
        const ulong r = r0 + slot;
        const bool live = r < rows;
        const ulong base = r * n;
        float acc = 0.0f;
        if (live) {
            for (ulong j = lane; j < n; j += LANES) acc = acc + ld_f(x, dt, base + j);
        }
        psum[slot][lane] = acc;
        barrier(CLK_LOCAL_MEM_FENCE);
        const float mean = live ? fold_local(psum[slot]) / nf : 0.0f;
        acc = 0.0f;
        if (live) {
            for (ulong j = lane; j < n; j += LANES) {
                float d = ld_f(x, dt, base + j) - mean;
                acc = acc + d * d;
            }
        }
        psq[slot][lane] = acc;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!live) continue;
        const float var = fold_local(psq[slot]) / nf;
        const float rs = 1.0f / sqrt(var + eps);
        for (ulong j = lane; j < n; j += LANES) {
            float y = (ld_f(x, dt, base + j) - mean) * rs;
            if (has_g) y = y * ld_f(g, dt, j);
            if (has_b) y = y + ld_f(b, dt, j);
            st_f(out, dt, base + j, y);
        }
    }
}

kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void k_rms_norm(global uchar* out, global const uchar* x, global const uchar* g, ulong rows,
                ulong n, int has_g, uint eps_bits, int dt) {
    local float psq[2][ROWS][LANES];
    uint lane, slot;
    lane_slot(1, &lane, &slot);
    const float eps = as_float(eps_bits);
    const float nf = convert_float_rte(n);
    FOR_ROW_BLOCKS(it, r0, rows) {
        const ulong r = r0 + slot;
        const bool live = r < rows;
        const ulong base = r * n;
        float acc = 0.0f;
        if (live) {
            for (ulong j = lane; j < n; j += LANES) {
                float v = ld_f(x, dt, base + j);
                acc = acc + v * v;
            }
        }
        psq[it][slot][lane] = acc;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!live) continue;
        const float rs = 1.0f / sqrt(fold_local(psq[it][slot]) / nf + eps);
        for (ulong j = lane; j < n; j += LANES) {
            float y = ld_f(x, dt, base + j) * rs;
            if (has_g) y = y * ld_f(g, dt, j);
            st_f(out, dt, base + j, y);
        }
    }
}
