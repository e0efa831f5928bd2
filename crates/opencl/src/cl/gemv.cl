// The few-row product (GEMV-shaped): out[batch, i, j] = fma chain over p of
// a[batch_a, i, p] * b[batch_b, p, j], for float dtypes, shaped for products with few rows
// (m <= 4: a decode step's activations times a weight), where a 32×32 or larger SGEMM block
// would compute mostly rows that do not exist.
//
// A work group of GEMV_T items owns a block of GEMV_T columns and up to 4 rows (one row block
// of 4; group row g walks the (batch, row block) pairs in a stride of the launched groups);
// item `lid` owns column n0 + lid and keeps the block's (up to) 4 accumulators of that column
// in registers. The group steps through k GEMV_KS at a time: it stages A's 4 × KS slice and
// B's KS × T slice in local memory, then every item runs p = 0, 1, … over the slice reading
// A's rows from local memory (the same address for every item: a broadcast) and its column of
// B from local memory (neighbouring items, neighbouring banks).
//
// The operands are strided views (meta + mg: A's row and k strides, B's k and column strides,
// in elements), so a transposed weight is read in place: the planner folds a permutation read
// only by such products into them. B's slice is loaded so that neighbouring items read
// neighbouring addresses of global memory: along k where B's column is contiguous (a
// transposed weight: each column's KS elements are read by KS consecutive items, then stored
// transposed into local memory), along the row otherwise. A's slice is loaded along k.
//
// Why the bits are the reference's: every accumulator starts at +0 and receives exactly one
// fma per p, p ascending across slices and within each, with nothing else ever added — one
// unbroken fma chain per output in the reference's order, whichever item, group or staging
// pattern holds it. The last slice runs only its K - p0 real steps (never a padded fma with
// zeros: fma(0, 0, -0) would turn a -0 chain into +0); rows and columns past M and N are
// computed from zeros but never stored. K = 0 stores +0. Each result is rounded once by
// `st_f`'s rules.

kernel __attribute__((reqd_work_group_size(GEMV_T, 1, 1)))
void k_gemv(global uchar* out, global const uchar* a, global const uchar* b, ulong M, ulong N,
            ulong K, int dt, global const long* meta, uint mo, uint mg, ulong batches) {
    local float as[4][GEMV_KS];
    local float bs[GEMV_KS][GEMV_T + 1];
    const uint lid = get_local_id(0);
    global const long* g = meta + mg;
    const ulong sam = (ulong)g[0], sak = (ulong)g[1], sbk = (ulong)g[2], sbn = (ulong)g[3];
    // B's column contiguous (and its row not): load along k.
    const bool kfast = sbk == 1 && sbn != 1;
    const ulong n0 = get_group_id(0) * GEMV_T;
    const ulong mblocks = (M + 3) / 4;
    for (ulong blk = get_group_id(1); blk < mblocks * batches; blk += get_num_groups(1)) {
        const ulong bi = blk / mblocks, m0 = blk % mblocks * 4;
        ulong off[2];
        view_offsets(meta + mo, bi, 2, off);
        float acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
        for (ulong p0 = 0; p0 < K; p0 += GEMV_KS) {
            // A's 4 × KS slice: element e is row e / KS, k p0 + e % KS.
            for (uint e = lid; e < 4 * GEMV_KS; e += GEMV_T) {
                const ulong i = m0 + e / GEMV_KS, p = p0 + e % GEMV_KS;
                as[e / GEMV_KS][e % GEMV_KS] =
                    (i < M && p < K) ? ld_f(a, dt, off[0] + i * sam + p * sak) : 0.0f;
            }
            // B's KS × T slice, stored k-major (bs[p][c]).
#pragma unroll 4
            for (uint s = 0; s < GEMV_KS; ++s) {
                const uint e = lid + s * GEMV_T;
                const uint pp = kfast ? e % GEMV_KS : e / GEMV_T;
                const uint c = kfast ? e / GEMV_KS : e % GEMV_T;
                const ulong p = p0 + pp, j = n0 + c;
                bs[pp][c] = (p < K && j < N) ? ld_f(b, dt, off[1] + p * sbk + j * sbn) : 0.0f;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            // The real steps of this slice: all GEMV_KS but in the last, never more.
            const uint kb = K - p0 < GEMV_KS ? (uint)(K - p0) : GEMV_KS;
            for (uint p = 0; p < kb; ++p) {
                const float bv = bs[p][lid];
                acc0 = fma(as[0][p], bv, acc0);
                acc1 = fma(as[1][p], bv, acc1);
                acc2 = fma(as[2][p], bv, acc2);
                acc3 = fma(as[3][p], bv, acc3);
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        const ulong j = n0 + lid;
        if (j < N) {
            const ulong ob = bi * M * N + m0 * N + j;
            st_f(out, dt, ob, acc0);
            if (m0 + 1 < M) st_f(out, dt, ob + N, acc1);
            if (m0 + 2 < M) st_f(out, dt, ob + 2 * N, acc2);
            if (m0 + 3 < M) st_f(out, dt, ob + 3 * N, acc3);
        }
    }
}

// The product with a quantised weight (`qmatmul`), shaped like `k_gemv`: out[r, j] = fma
// chain over k of a[r, k] * w's row j dequantised, for R rows of `a` (every batch's rows in
// a row: `a` is contiguous f32 [R, NB * 32]) and the N rows of `w` (u8 [N, NB, bb], blocks
// of format `fmt`).
//
// A work group of GEMV_T items owns GEMV_T weight rows (output columns) and up to 4 rows of
// `a` (group row g walks the row blocks in a stride of the launched groups); item `lid` owns
// column n0 + lid and keeps its 4 accumulators in registers. The group steps through the
// blocks QGEMV_KB at a time: it stages A's 4 × (KB * 32) slice in local memory, and its
// GEMV_T rows' KB blocks — each row's span of KB * bb contiguous bytes, read so that
// neighbouring items read neighbouring addresses (4-byte words where `words` says every span
// is word-aligned, bytes otherwise) — at a row stride of an odd number of words, so that the
// items dequantising their own rows hit different banks.
//
// Why the bits are the reference's: each element is dequantised by the same functions as
// `k_qmatmul`'s (`q_value`: one or two rounded operations), and every accumulator starts at
// +0 and receives exactly one fma per k, blocks ascending and elements ascending within each,
// nothing else ever added. Slices hold only real blocks (a block always has 32 real
// elements), rows past R and columns past N are computed from zeros and never stored. NB = 0
// stores +0. Each result is rounded once by `st_f`.

// Where byte t of a word sits in a staged (local) word.
#ifdef __ENDIAN_LITTLE__
#define BYTE_SHIFT(t) (8u * (t))
#else
#define BYTE_SHIFT(t) (8u * (3u - (t)))
#endif

// The 32 values of a block in local memory, each computed exactly as `q_value` computes it,
// but with the block's bytes read once and the format decided once: the product's chain
// then waits on nothing but its own fmas.
void q_block_l(local const uchar* b, int fmt, float* v) {
    const float d = q_half_l(b);
    local const uchar* qs = b + (fmt == Q_Q4_1 ? 4 : 2);
    uchar byte[16];
#pragma unroll
    for (uint i = 0; i < 16; ++i) byte[i] = qs[i];
    if (fmt == Q_Q8_0) {
#pragma unroll
        for (uint e = 0; e < 32; ++e) v[e] = convert_float((int)(char)b[2 + e]) * d;
    } else if (fmt == Q_Q4_0) {
#pragma unroll
        for (uint i = 0; i < 16; ++i) {
            v[i] = convert_float((int)(byte[i] & 15u) - 8) * d;
            v[i + 16] = convert_float((int)(byte[i] >> 4) - 8) * d;
        }
    } else {
        const float m = q_min_l(b, fmt);
#pragma unroll
        for (uint i = 0; i < 16; ++i) {
            v[i] = d * convert_float((int)(byte[i] & 15u)) + m;
            v[i + 16] = d * convert_float((int)(byte[i] >> 4)) + m;
        }
    }
}

kernel __attribute__((reqd_work_group_size(GEMV_T, 1, 1)))
void k_qgemv(global uchar* out, global const uchar* a, global const uchar* w, ulong R, ulong N,
             ulong NB, int fmt, uint bb, int words) {
    local float as[4][QGEMV_KB * 32];
    local uint ws[GEMV_T * QGEMV_STRIDE];
    const uint lid = get_local_id(0);
    const ulong n0 = get_group_id(0) * GEMV_T;
    const ulong K = NB * 32, row_bytes = NB * bb;
    // Each row's span in local memory: an odd number of words.
    const uint stride = ((QGEMV_KB * bb + 3) / 4) | 1u;
    local const uchar* mine = (local const uchar*)(ws + lid * stride);
    const ulong rblocks = (R + 3) / 4;
    for (ulong blk = get_group_id(1); blk < rblocks; blk += get_num_groups(1)) {
        const ulong r0 = blk * 4;
        const bool one = R - r0 == 1;
        float acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
        for (ulong b0 = 0; b0 < NB; b0 += QGEMV_KB) {
            const uint kb = NB - b0 < QGEMV_KB ? (uint)(NB - b0) : QGEMV_KB;
            for (uint e = lid; e < 4 * QGEMV_KB * 32; e += GEMV_T) {
                const ulong r = r0 + e / (QGEMV_KB * 32), p = b0 * 32 + e % (QGEMV_KB * 32);
                as[e / (QGEMV_KB * 32)][e % (QGEMV_KB * 32)] =
                    (r < R && p < K) ? ld_f(a, DT_F32, r * K + p) : 0.0f;
            }
            // Each row's span as words; a word's bytes read one by one unless `words` says
            // every span starts on a word (a multiple of 4 * bb bytes into a row starting on
            // one) and ends on one (the next slice, or the row's word-aligned end).
            const uint span = kb * bb, span_w = (span + 3) / 4;
            for (uint e = lid; e < GEMV_T * span_w; e += GEMV_T) {
                const uint c = e / span_w, i = e % span_w;
                const ulong j = n0 + c, at = j * row_bytes + b0 * bb + 4 * i;
                uint word = 0u;
                if (j < N && words) word = ((global const uint*)w)[at / 4];
                if (j < N && !words)
                    for (uint t = 0; t < 4 && 4 * i + t < span; ++t)
                        word |= (uint)w[at + t] << BYTE_SHIFT(t);
                ws[c * stride + i] = word;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            for (uint q = 0; q < kb; ++q) {
                float v[32];
                q_block_l(mine + q * bb, fmt, v);
                local const float* a0 = &as[0][q * 32];
                if (one) {
#pragma unroll
                    for (uint e = 0; e < 32; ++e) acc0 = fma(a0[e], v[e], acc0);
                } else {
#pragma unroll
                    for (uint e = 0; e < 32; ++e) {
                        acc0 = fma(a0[e], v[e], acc0);
                        acc1 = fma(as[1][q * 32 + e], v[e], acc1);
                        acc2 = fma(as[2][q * 32 + e], v[e], acc2);
                        acc3 = fma(as[3][q * 32 + e], v[e], acc3);
                    }
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        const ulong j = n0 + lid;
        if (j < N) {
            const ulong ob = r0 * N + j;
            st_f(out, DT_F32, ob, acc0);
            if (r0 + 1 < R) st_f(out, DT_F32, ob + N, acc1);
            if (r0 + 2 < R) st_f(out, DT_F32, ob + 2 * N, acc2);
            if (r0 + 3 < R) st_f(out, DT_F32, ob + 3 * N, acc3);
        }
    }
}
