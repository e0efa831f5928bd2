// Reductions, softmax and the norms: one work item per output row, visiting the row's
// elements in the reference's order (row-major over the reduced axes) with the project's
// 16-lane summation order, so every sum has exactly the reference's bits. Recomputing
// exp(x - m) in softmax's last pass gives the same bits as storing it, without scratch.

// Advance a row-major multi-index over the reduced axes, keeping the element offset. `rm`:
// [rank, dims..., strides...].
void odometer(global const long* rm, int rr, ulong* idx, ulong* off) {
    for (int d = rr - 1; d >= 0; --d) {
        ulong dim = (ulong)rm[1 + d], st = (ulong)rm[1 + rr + d];
        idx[d] += 1;
        *off += st;
        if (idx[d] < dim) return;
        *off -= st * dim;
        idx[d] = 0;
    }
}

// meta + mk: the kept positions as a one-operand view over the output shape; meta + mr: the
// reduced axes as [rank, dims..., strides...]. `odt` is the result's dtype.
kernel void k_reduce(global uchar* out, global const uchar* x, ulong nout, ulong nred, int op,
                      int dt, int odt, global const long* meta, uint mk, uint mr) {
    global const long* rm = meta + mr;
    int rr = (int)rm[0];
    FOR_EACH(o, nout) {
        ulong base;
        view_offsets(meta + mk, o, 1, &base);
        ulong idx[8];
        for (int d = 0; d < 8; ++d) idx[d] = 0;
        ulong off = 0;
        if (is_float_dt(dt)) {
            float acc[16];
            for (int l = 0; l < 16; ++l) acc[l] = 0.0f;
            float best = 0.0f;
            long besti = 0;
            for (ulong j = 0; j < nred; ++j) {
                float v = ld_f(x, dt, base + off);
                if (op == R_SUM || op == R_MEAN) {
                    acc[j & 15] = acc[j & 15] + v;
                } else if (j == 0) {
                    best = v;
                } else if (op == R_REDUCE_MAX) {
                    best = tn_fmax(best, v);
                } else if (op == R_REDUCE_MIN) {
                    best = tn_fmin(best, v);
                } else if (!tn_is_nan(best)) {
                    // argmax/argmin: NaN is the extreme, the first one wins; ties keep the first.
                    bool better = op == R_ARGMAX ? v > best : v < best;
                    if (tn_is_nan(v) || better) {
                        best = v;
                        besti = (long)j;
                    }
                }
                odometer(rm, rr, idx, &off);
            }
            if (op == R_SUM) st_f(out, odt, o, fold_lanes(acc));
            else if (op == R_MEAN) st_f(out, odt, o, fold_lanes(acc) / convert_float_rte(nred));
            else if (op == R_REDUCE_MAX || op == R_REDUCE_MIN) st_f(out, odt, o, best);
            else st_i(out, odt, o, besti);
        } else {
            ulong sum = 0;
            long best = 0, besti = 0;
            for (ulong j = 0; j < nred; ++j) {
                long v = ld_i(x, dt, base + off);
                if (op == R_SUM || op == R_MEAN) sum += (ulong)v;
                else if (j == 0) best = v;
                else if (op == R_REDUCE_MAX) best = v > best ? v : best;
                else if (op == R_REDUCE_MIN) best = v < best ? v : best;
                else if (op == R_ARGMAX ? v > best : v < best) {
                    best = v;
                    besti = (long)j;
                }
                odometer(rm, rr, idx, &off);
            }
            if (op == R_SUM || op == R_MEAN) st_i(out, odt, o, as_long(sum));
            else if (op == R_REDUCE_MAX || op == R_REDUCE_MIN) st_i(out, odt, o, best);
            else st_i(out, odt, o, besti);
        }
    }
}

// Softmax or log-softmax along one axis of length `len` and element stride `stride`; meta +
// mk: the rows' base offsets as a one-operand view.
kernel void k_softmax(global uchar* out, global const uchar* x, ulong rows, ulong len,
                       ulong stride, int op, int dt, global const long* meta, uint mk) {
    FOR_EACH(r, rows) {
        ulong base;
        view_offsets(meta + mk, r, 1, &base);
        if (len == 0) continue;
        float m = ld_f(x, dt, base);
        for (ulong j = 1; j < len; ++j) m = tn_fmax(m, ld_f(x, dt, base + j * stride));
        float acc[16];
        for (int l = 0; l < 16; ++l) acc[l] = 0.0f;
        for (ulong j = 0; j < len; ++j)
            acc[j & 15] = acc[j & 15] + tn_exp(ld_f(x, dt, base + j * stride) - m);
        float s = fold_lanes(acc);
        if (op == N_SOFTMAX) {
            for (ulong j = 0; j < len; ++j) {
                ulong at = base + j * stride;
                st_f(out, dt, at, tn_exp(ld_f(x, dt, at) - m) / s);
            }
        } else {
            float ls = tn_log(s);
            for (ulong j = 0; j < len; ++j) {
                ulong at = base + j * stride;
                st_f(out, dt, at, (ld_f(x, dt, at) - m) - ls);
            }
        }
    }
}

// Layer norm over contiguous rows of `n` elements; gamma and beta optional.
kernel void k_layer_norm(global uchar* out, global const uchar* x, global const uchar* g,
                          global const uchar* b, ulong rows, ulong n, int has_g, int has_b,
                          uint eps_bits, int dt) {
    float eps = as_float(eps_bits);
    float nf = convert_float_rte(n);
    FOR_EACH(r, rows) {
        ulong base = r * n;
        float acc[16];
        for (int l = 0; l < 16; ++l) acc[l] = 0.0f;
        for (ulong j = 0; j < n; ++j) acc[j & 15] = acc[j & 15] + ld_f(x, dt, base + j);
        float mean = fold_lanes(acc) / nf;
        for (int l = 0; l < 16; ++l) acc[l] = 0.0f;
        for (ulong j = 0; j < n; ++j) {
            float d = ld_f(x, dt, base + j) - mean;
            acc[j & 15] = acc[j & 15] + d * d;
        }
        float var = fold_lanes(acc) / nf;
        float rs = 1.0f / sqrt(var + eps);
        for (ulong j = 0; j < n; ++j) {
            float y = (ld_f(x, dt, base + j) - mean) * rs;
            if (has_g) y = y * ld_f(g, dt, j);
            if (has_b) y = y + ld_f(b, dt, j);
            st_f(out, dt, base + j, y);
        }
    }
}

kernel void k_rms_norm(global uchar* out, global const uchar* x, global const uchar* g,
                        ulong rows, ulong n, int has_g, uint eps_bits, int dt) {
    float eps = as_float(eps_bits);
    float nf = convert_float_rte(n);
    FOR_EACH(r, rows) {
        ulong base = r * n;
        float acc[16];
        for (int l = 0; l < 16; ++l) acc[l] = 0.0f;
        for (ulong j = 0; j < n; ++j) {
            float v = ld_f(x, dt, base + j);
            acc[j & 15] = acc[j & 15] + v * v;
        }
        float rs = 1.0f / sqrt(fold_lanes(acc) / nf + eps);
        for (ulong j = 0; j < n; ++j) {
            float y = ld_f(x, dt, base + j) * rs;
            if (has_g) y = y * ld_f(g, dt, j);
            st_f(out, dt, base + j, y);
        }
    }
}
