// The register-tiled SGEMM, a template: `kernels.rs` defines GEMM_NAME, GEMM_TX, GEMM_TY,
// GEMM_RM, GEMM_RN and GEMM_KB before each copy (one kernel per tile configuration, all in
// the Linalg program).
//
// out[batch, i, j] = fma chain over p of a[batch_a, i, p] * b[batch_b, p, j], for float
// dtypes. A work group of GEMM_TX × GEMM_TY items computes a block of BM = GEMM_TY·GEMM_RM
// rows by BN = GEMM_TX·GEMM_RN columns; item (tx, ty) holds GEMM_RM × GEMM_RN accumulators in
// registers, for rows ty·4 + r + 4·GEMM_TY·i4 and columns tx·4 + c + 4·GEMM_TX·j4 of the block
// (float4 columns: adjacent items read adjacent float4s of local memory and write adjacent
// float4s of the result). The block steps through k GEMM_KB at a time: the group stages A's
// BM × KB slice (transposed, k-major) and B's KB × BN slice in local memory, each item loading
// its share as float4s into registers one step ahead (the loads of step t+1 are in flight
// while step t computes), then every item runs p = 0, 1, … over the slice:
// acc[i][j] = fma(A[i, p0+p], B[p0+p, j], acc[i][j]).
//
// Why the bits are the reference's: every accumulator starts at +0 and receives exactly one
// fma per p, p ascending across slices and within each, with nothing else ever added — one
// unbroken fma chain per output in the reference's order. The last slice runs only its
// K - p0 real steps (never a padded fma with zeros: fma(0, 0, -0) would turn a -0 chain into
// +0); rows and columns past M and N are computed from zeros but never stored. K = 0 stores
// +0. The result is rounded once by `st_f`'s rules. How items, groups or slices are laid out
// changes which register holds a chain, never the chain.
//
// Launched as (ceil(N / BN) · GEMM_T, g, 1) items in groups of (GEMM_T, 1, 1); group row g
// walks the (batch, row block) pairs in a stride of the launched groups.

#define GEMM_T (GEMM_TX * GEMM_TY)
#define GEMM_BM (GEMM_TY * GEMM_RM)
#define GEMM_BN (GEMM_TX * GEMM_RN)
#define GEMM_LDA (GEMM_BM + 4)
#define GEMM_LDB (GEMM_BN + 4)
#define GEMM_ACH (GEMM_BM * GEMM_KB / 4 / GEMM_T)
#define GEMM_BCH (GEMM_BN * GEMM_KB / 4 / GEMM_T)

kernel __attribute__((reqd_work_group_size(GEMM_T, 1, 1)))
void GEMM_NAME(global uchar* out, global const uchar* a, global const uchar* b, ulong M,
               ulong N, ulong K, int dt, int vec, global const long* meta, uint mo,
               ulong batches) {
    local float4 as4[GEMM_KB * GEMM_LDA / 4];
    local float4 bs4[GEMM_KB * GEMM_LDB / 4];
    local float* as = (local float*)as4;
    const uint lid = get_local_id(0);
    const uint tx = lid % GEMM_TX, ty = lid / GEMM_TX;
    // vec bit 0: A as float4s; bit 1: B and the result as float4s.
    const bool va = (vec & 1) != 0, vb = (vec & 2) != 0;
    const ulong n0 = get_group_id(0) * GEMM_BN;
    const ulong mblocks = (M + GEMM_BM - 1) / GEMM_BM;
    for (ulong blk = get_group_id(1); blk < mblocks * batches; blk += get_num_groups(1)) {
        const ulong bi = blk / mblocks, m0 = blk % mblocks * GEMM_BM;
        ulong off[2];
        view_offsets(meta + mo, bi, 2, off);
        float acc[GEMM_RM][GEMM_RN];
#pragma unroll
        for (int i = 0; i < GEMM_RM; ++i)
#pragma unroll
            for (int j = 0; j < GEMM_RN; ++j) acc[i][j] = 0.0f;
        // This item's share of a slice: A chunk q is row q / (KB/4) of the block, k columns
        // 4·(q % (KB/4)) onward; B chunk q is k row q / (BN/4), columns 4·(q % (BN/4)) onward.
        float4 ra[GEMM_ACH], rb[GEMM_BCH];
#pragma unroll
        for (int s = 0; s < GEMM_ACH; ++s) {
            uint q = lid + s * GEMM_T;
            ra[s] = gemm_ld_a(a, dt, va, off[0], m0 + q / (GEMM_KB / 4), (q % (GEMM_KB / 4)) * 4,
                              M, K);
        }
#pragma unroll
        for (int s = 0; s < GEMM_BCH; ++s) {
            uint q = lid + s * GEMM_T;
            rb[s] = gemm_ld_b(b, dt, vb, off[1], q / (GEMM_BN / 4), n0 + (q % (GEMM_BN / 4)) * 4,
                              K, N);
        }
        for (ulong p0 = 0; p0 < K; p0 += GEMM_KB) {
#pragma unroll
            for (int s = 0; s < GEMM_ACH; ++s) {
                uint q = lid + s * GEMM_T;
                uint row = q / (GEMM_KB / 4), k = (q % (GEMM_KB / 4)) * 4;
                as[(k + 0) * GEMM_LDA + row] = ra[s].s0;
                as[(k + 1) * GEMM_LDA + row] = ra[s].s1;
                as[(k + 2) * GEMM_LDA + row] = ra[s].s2;
                as[(k + 3) * GEMM_LDA + row] = ra[s].s3;
            }
#pragma unroll
            for (int s = 0; s < GEMM_BCH; ++s) {
                uint q = lid + s * GEMM_T;
                bs4[q / (GEMM_BN / 4) * (GEMM_LDB / 4) + q % (GEMM_BN / 4)] = rb[s];
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            const ulong pn = p0 + GEMM_KB;
            if (pn < K) {
#pragma unroll
                for (int s = 0; s < GEMM_ACH; ++s) {
                    uint q = lid + s * GEMM_T;
                    ra[s] = gemm_ld_a(a, dt, va, off[0], m0 + q / (GEMM_KB / 4),
                                      pn + (q % (GEMM_KB / 4)) * 4, M, K);
                }
#pragma unroll
                for (int s = 0; s < GEMM_BCH; ++s) {
                    uint q = lid + s * GEMM_T;
                    rb[s] = gemm_ld_b(b, dt, vb, off[1], pn + q / (GEMM_BN / 4),
                                      n0 + (q % (GEMM_BN / 4)) * 4, K, N);
                }
            }
            // The real steps of this slice: all GEMM_KB but in the last, never more.
            const uint kb = K - p0 < GEMM_KB ? (uint)(K - p0) : GEMM_KB;
#pragma unroll
            for (uint p = 0; p < GEMM_KB; ++p) {
                if (p < kb) {
                    float av[GEMM_RM], bv[GEMM_RN];
#pragma unroll
                    for (int i4 = 0; i4 < GEMM_RM / 4; ++i4) {
                        float4 t = as4[p * (GEMM_LDA / 4) + i4 * GEMM_TY + ty];
                        av[4 * i4] = t.s0;
                        av[4 * i4 + 1] = t.s1;
                        av[4 * i4 + 2] = t.s2;
                        av[4 * i4 + 3] = t.s3;
                    }
#pragma unroll
                    for (int j4 = 0; j4 < GEMM_RN / 4; ++j4) {
                        float4 t = bs4[p * (GEMM_LDB / 4) + j4 * GEMM_TX + tx];
                        bv[4 * j4] = t.s0;
                        bv[4 * j4 + 1] = t.s1;
                        bv[4 * j4 + 2] = t.s2;
                        bv[4 * j4 + 3] = t.s3;
                    }
#pragma unroll
                    for (int i = 0; i < GEMM_RM; ++i)
#pragma unroll
                        for (int j = 0; j < GEMM_RN; ++j)
                            acc[i][j] = fma(av[i], bv[j], acc[i][j]);
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        const ulong ob = bi * M * N;
#pragma unroll
        for (int i4 = 0; i4 < GEMM_RM / 4; ++i4)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const ulong i = m0 + i4 * 4 * GEMM_TY + ty * 4 + r;
#pragma unroll
                for (int j4 = 0; j4 < GEMM_RN / 4; ++j4) {
                    const int c = 4 * j4;
                    gemm_st(out, dt, vb, ob, i, n0 + j4 * 4 * GEMM_TX + tx * 4, M, N,
                            (float4)(acc[4 * i4 + r][c], acc[4 * i4 + r][c + 1],
                                     acc[4 * i4 + r][c + 2], acc[4 * i4 + r][c + 3]));
                }
            }
    }
}

#undef GEMM_T
#undef GEMM_BM
#undef GEMM_BN
#undef GEMM_LDA
#undef GEMM_LDB
#undef GEMM_ACH
#undef GEMM_BCH
