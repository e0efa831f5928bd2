// Helpers of the register-tiled SGEMM (the template `gemm.cl`, instantiated once per tile
// configuration after this file). They move A's and B's elements between global memory and
// f32 registers four at a time: as one float4 where the dtype is f32 and the four lie inside
// the matrix at a 16-byte aligned address (the planner's `vec` flags: K or N a multiple of 4,
// so every row starts aligned), else element by element through `ld_f`/`st_f`. Positions
// outside the matrix read as zero; they are never used in a product (the k-loop stops at K,
// and rows or columns past M or N are never stored).

// A[i, p..p+4] (A row-major M × K at element `base`).
float4 gemm_ld_a(global const uchar* a, int dt, bool v4, ulong base, ulong i, ulong p, ulong M,
                 ulong K) {
    float4 v = (float4)(0.0f);
    if (i >= M || p >= K) return v;
    ulong at = base + i * K + p;
    if (v4 && p + 4 <= K) return *(global const float4*)((global const float*)a + at);
    v.s0 = ld_f(a, dt, at);
    if (p + 1 < K) v.s1 = ld_f(a, dt, at + 1);
    if (p + 2 < K) v.s2 = ld_f(a, dt, at + 2);
    if (p + 3 < K) v.s3 = ld_f(a, dt, at + 3);
    return v;
}

// B[p, j..j+4] (B row-major K × N at element `base`).
float4 gemm_ld_b(global const uchar* b, int dt, bool v4, ulong base, ulong p, ulong j, ulong K,
                 ulong N) {
    float4 v = (float4)(0.0f);
    if (p >= K || j >= N) return v;
    ulong at = base + p * N + j;
    if (v4 && j + 4 <= N) return *(global const float4*)((global const float*)b + at);
    v.s0 = ld_f(b, dt, at);
    if (j + 1 < N) v.s1 = ld_f(b, dt, at + 1);
    if (j + 2 < N) v.s2 = ld_f(b, dt, at + 2);
    if (j + 3 < N) v.s3 = ld_f(b, dt, at + 3);
    return v;
}

// out[i, j..j+4] = v (the result M × N at element `base`), each rounded once to the dtype
// with NaN made canonical, as `st_f` does.
void gemm_st(global uchar* out, int dt, bool v4, ulong base, ulong i, ulong j, ulong M, ulong N,
             float4 v) {
    if (i >= M || j >= N) return;
    ulong at = base + i * N + j;
    if (v4 && j + 4 <= N) {
        float4 c = (float4)(tn_canonical(v.s0), tn_canonical(v.s1), tn_canonical(v.s2),
                            tn_canonical(v.s3));
        *(global float4*)((global float*)out + at) = c;
        return;
    }
    st_f(out, dt, at, v.s0);
    if (j + 1 < N) st_f(out, dt, at + 1, v.s1);
    if (j + 2 < N) st_f(out, dt, at + 2, v.s2);
    if (j + 3 < N) st_f(out, dt, at + 3, v.s3);
}
