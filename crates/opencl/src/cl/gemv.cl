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
