// Matrix products, convolution and pooling: one work item per output element, each running
// its chain of fused multiply-adds (explicit `fma`, correctly rounded by the OpenCL spec) in
// exactly the reference's order, so the result does not depend on how work is split. Float
// products normally run on the register-tiled SGEMM (`gemm.cl`, instantiated before this
// file) or, with at most 4 rows, on `k_gemv` (`gemv.cl`); `k_matmul` serves integer products
// and devices that can run none of them.
// Convolution and pooling stay one item per output: each output's chain (input channel, kh,
// kw, skipping padding) is short and its own, and neighbouring items read neighbouring inputs.

// out[batch, i, j] = fma chain over p of a[batch_a, i, p] * b[batch_b, p, j]. meta + mo: a
// two-operand view over the batch shape giving each operand's batch offset in elements.
kernel void k_matmul(global uchar* out, global const uchar* a, global const uchar* b,
                      ulong total, ulong M, ulong N, ulong K, int dt, global const long* meta,
                      uint mo) {
    FOR_EACH(o, total) {
        ulong j = o % N, t = o / N;
        ulong i = t % M, bi = t / M;
        ulong off[2];
        view_offsets(meta + mo, bi, 2, off);
        ulong ar = off[0] + i * K, bc = off[1] + j;
        if (is_float_dt(dt)) {
            float acc = 0.0f;
            for (ulong p = 0; p < K; ++p)
                acc = fma(ld_f(a, dt, ar + p), ld_f(b, dt, bc + p * N), acc);
            st_f(out, dt, o, acc);
        } else {
            ulong acc = 0;
            for (ulong p = 0; p < K; ++p)
                acc += (ulong)ld_i(a, dt, ar + p) * (ulong)ld_i(b, dt, bc + p * N);
            st_i(out, dt, o, as_long(acc));
        }
    }
}

// qmatmul: out[r, j] = fma chain over p of a[r, p] * deq(w)[j, p] (a f32 [R, K], rows of every
// batch in a row; w [N, K/32 blocks of bb bytes]), p ascending, each block's scale decoded once
// and its 32 elements dequantised on the fly with the reference's formula (`q_value`): the
// reference's chain, so the bits of `matmul(a, transpose(dequantize(w)))`.
kernel void k_qmatmul(global uchar* out, global const uchar* a, global const uchar* w,
                       ulong total, ulong N, ulong NB, int fmt, uint bb) {
    FOR_EACH(o, total) {
        const ulong j = o % N, r = o / N;
        const ulong ar = r * NB * 32;
        global const uchar* wr = w + j * NB * bb;
        float acc = 0.0f;
        for (ulong blk = 0; blk < NB; ++blk) {
            global const uchar* b = wr + blk * bb;
            const float d = q_half(b), m = q_min(b, fmt);
            for (uint e = 0; e < 32; ++e)
                acc = fma(ld_f(a, DT_F32, ar + blk * 32 + e), q_value(b, fmt, d, m, e), acc);
        }
        st_f(out, DT_F32, o, acc);
    }
}

// A weight block's integer e for qmatmul_q8: q - 8 (Q4_0), q (Q4_1) or the signed byte (Q8_0).
int q_int(global const uchar* b, int fmt, uint e) {
    if (fmt == Q_Q8_0) return (int)(char)b[2 + e];
    const uint byte = b[(fmt == Q_Q4_1 ? 4u : 2u) + (e & 15u)];
    const int q = (int)(e < 16u ? (byte & 15u) : (byte >> 4));
    return fmt == Q_Q4_0 ? q - 8 : q;
}

// qmatmul_q8 (the reference's `quant` module defines it): over the blocks in order, from +0,
// acc = fma(d_w * d, S, acc) and for Q4_1 then acc = fma(m_w, d * Q, acc), where the row's
// activation block is rounded as the reference rounds it — amax (NaN if any element is),
// d = amax / 127, inv = 1 / d (0 when d is 0), q = rint(x * inv) (ties to even) clamped to
// ±127 and 0 for NaN — and S = Σ w_e q_e, Q = Σ q_e are exact integer sums. Each item rounds
// its row's blocks itself: the same bits wherever it runs. Division is correctly rounded
// (the program's build options) and FP_CONTRACT is off, so each operation rounds once.
kernel void k_qmatmul_q8(global uchar* out, global const uchar* a, global const uchar* w,
                         ulong total, ulong N, ulong NB, int fmt, uint bb) {
    FOR_EACH(o, total) {
        const ulong j = o % N, r = o / N;
        const ulong ar = r * NB * 32;
        global const uchar* wr = w + j * NB * bb;
        float acc = 0.0f;
        for (ulong blk = 0; blk < NB; ++blk) {
            const ulong x0 = ar + blk * 32;
            float amax = 0.0f;
            int nan = 0;
            for (uint e = 0; e < 32; ++e) {
                const float x = ld_f(a, DT_F32, x0 + e);
                if (isnan(x)) nan = 1;
                else amax = fmax(amax, fabs(x));
            }
            if (nan) amax = NAN;
            const float d = amax / 127.0f;
            const float inv = d == 0.0f ? 0.0f : 1.0f / d;
            global const uchar* b = wr + blk * bb;
            int s = 0, qsum = 0;
            for (uint e = 0; e < 32; ++e) {
                const float t = rint(ld_f(a, DT_F32, x0 + e) * inv);
                const int q = isnan(t) ? 0 : (int)fmin(fmax(t, -127.0f), 127.0f);
                qsum += q;
                s += q_int(b, fmt, e) * q;
            }
            acc = fma(q_half(b) * d, (float)s, acc);
            if (fmt == Q_Q4_1) acc = fma(q_min(b, fmt), d * (float)qsum, acc);
        }
        st_f(out, DT_F32, o, acc);
    }
}

// Geometry in meta + mo: N, C, H, W, O, C/groups, KH, KW, OH, OW, stride h/w, padding
// top/left, dilation h/w, O/groups.
kernel void k_conv2d(global uchar* out, global const uchar* x, global const uchar* w,
                      global const uchar* bias, ulong total, int has_bias, int dt,
                      global const long* meta, uint mo) {
    global const long* g = meta + mo;
    long C = g[1], H = g[2], W = g[3], O = g[4], CG = g[5], KH = g[6], KW = g[7];
    long OH = g[8], OW = g[9], SH = g[10], SW = g[11], PH = g[12], PW = g[13];
    long DH = g[14], DW = g[15], OG = g[16];
    FOR_EACH(o, total) {
        long ow = (long)(o % (ulong)OW);
        ulong t = o / (ulong)OW;
        long oh = (long)(t % (ulong)OH);
        t /= (ulong)OH;
        long oc = (long)(t % (ulong)O);
        long n = (long)(t / (ulong)O);
        long grp = oc / OG;
        float acc = 0.0f;
        for (long ci = 0; ci < CG; ++ci) {
            for (long i = 0; i < KH; ++i) {
                long ih = oh * SH + i * DH - PH;
                if (ih < 0 || ih >= H) continue;
                for (long j = 0; j < KW; ++j) {
                    long iw = ow * SW + j * DW - PW;
                    if (iw < 0 || iw >= W) continue;
                    ulong xi = (ulong)(((n * C + grp * CG + ci) * H + ih) * W + iw);
                    ulong wi = (ulong)(((oc * CG + ci) * KH + i) * KW + j);
                    acc = fma(ld_f(x, dt, xi), ld_f(w, dt, wi), acc);
                }
            }
        }
        if (has_bias) acc = acc + ld_f(bias, dt, (ulong)oc);
        st_f(out, dt, o, acc);
    }
}

// Geometry in meta + mo: C, H, W, KH, KW, OH, OW, stride h/w, padding top/left, dilation h/w;
// `count_bits`: kh * kw as f32 bits (the divisor of avg_pool2d_include_pad).
kernel void k_pool2d(global uchar* out, global const uchar* x, ulong total, int kind, int dt,
                      uint count_bits, global const long* meta, uint mo) {
    global const long* g = meta + mo;
    long H = g[1], W = g[2], KH = g[3], KW = g[4], OH = g[5], OW = g[6];
    long SH = g[7], SW = g[8], PH = g[9], PW = g[10], DH = g[11], DW = g[12];
    FOR_EACH(o, total) {
        long ow = (long)(o % (ulong)OW);
        ulong t = o / (ulong)OW;
        long oh = (long)(t % (ulong)OH);
        t /= (ulong)OH;
        long nc = (long)t; // n * C + c
        ulong taps = 0;
        float bestf = TN_NAN, sum = 0.0f;
        long besti = 0;
        for (long i = 0; i < KH; ++i) {
            long ih = oh * SH + i * DH - PH;
            if (ih < 0 || ih >= H) continue;
            for (long j = 0; j < KW; ++j) {
                long iw = ow * SW + j * DW - PW;
                if (iw < 0 || iw >= W) continue;
                ulong xi = (ulong)((nc * H + ih) * W + iw);
                if (is_float_dt(dt)) {
                    float v = ld_f(x, dt, xi);
                    if (kind == P_MAX_POOL2D) bestf = taps == 0 ? v : tn_fmax(bestf, v);
                    else sum = sum + v;
                } else {
                    long v = ld_i(x, dt, xi);
                    besti = (taps == 0 || v > besti) ? v : besti;
                }
                taps += 1;
            }
        }
        if (!is_float_dt(dt)) st_i(out, dt, o, besti);
        else if (kind == P_MAX_POOL2D) st_f(out, dt, o, bestf);
        else if (kind == P_AVG_POOL2D) st_f(out, dt, o, sum / convert_float_rte(taps));
        else st_f(out, dt, o, sum / as_float(count_bits));
    }
}
