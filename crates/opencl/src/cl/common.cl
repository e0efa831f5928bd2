// Shared by every kernel family (after the preamble and the generated op-code defines): how
// an element of each dtype is read as f32 or i64 and written back exactly as the reference
// interpreter encodes it, and how a flat output index maps to offsets in strided operands.
//
// Buffers are byte buffers (`global uchar*`); the dtype code says how to read them. Float
// elements travel as their bit patterns (`as_float`/`as_uint`) so nothing between the buffer
// and the arithmetic can touch a payload or a denormal.

#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2
#define DT_I32 3
#define DT_I64 4
#define DT_U8 5
#define DT_BOOL 6

bool is_float_dt(int dt) { return dt <= DT_BF16; }

float ld_f(global const uchar* p, int dt, ulong i) {
    if (dt == DT_F32) return as_float(((global const uint*)p)[i]);
    if (dt == DT_F16) return tn_f16_to_f32(((global const ushort*)p)[i]);
    return tn_bf16_to_f32(((global const ushort*)p)[i]);
}

// Round once to the storage type; any NaN becomes the canonical one first, as the
// reference's `floats_to` does.
void st_f(global uchar* p, int dt, ulong i, float v) {
    v = tn_canonical(v);
    if (dt == DT_F32) ((global uint*)p)[i] = as_uint(v);
    else if (dt == DT_F16) ((global ushort*)p)[i] = tn_f32_to_f16(v);
    else ((global ushort*)p)[i] = tn_f32_to_bf16(v);
}

// Integers and bools as i64 (u8 and bool zero-extended), as the reference's `to_i64_vec`.
long ld_i(global const uchar* p, int dt, ulong i) {
    if (dt == DT_I32) return (long)((global const int*)p)[i];
    if (dt == DT_I64) return ((global const long*)p)[i];
    return (long)p[i];
}

// Two's complement truncation (`ints_to`); bool stores `v != 0`. Narrowing goes through
// unsigned types, whose conversions are defined modulo 2^n in C.
void st_i(global uchar* p, int dt, ulong i, long v) {
    if (dt == DT_I32) ((global uint*)p)[i] = (uint)(ulong)v;
    else if (dt == DT_I64) ((global long*)p)[i] = v;
    else if (dt == DT_U8) p[i] = (uchar)(ulong)v;
    else p[i] = (uchar)(v != 0);
}

// Copy one element of `size` bytes (1, 2, 4 or 8) as raw bits.
void copy_el(global uchar* dst, ulong di, global const uchar* src, ulong si, int size) {
    if (size == 4) ((global uint*)dst)[di] = ((global const uint*)src)[si];
    else if (size == 2) ((global ushort*)dst)[di] = ((global const ushort*)src)[si];
    else if (size == 8) ((global ulong*)dst)[di] = ((global const ulong*)src)[si];
    else dst[di] = src[si];
}

// A strided view of `nops` operands over one iteration shape, in the meta buffer at `m`:
// m[0] = rank r; m[1..=r] = the shape; then per operand k, at 1 + r + k*(r+1): its base
// offset and its r strides (elements; 0 where it broadcasts). Flat index `o` (row-major over
// the shape, below its size) gives each operand's element offset in `off`.
void view_offsets(global const long* m, ulong o, int nops, ulong* off) {
    int r = (int)m[0];
    if (r == 1) {
        // One axis (merged views often have one): `o` is the index, no division needed.
        for (int k = 0; k < nops; ++k) off[k] = (ulong)m[2 + 2 * k] + o * (ulong)m[3 + 2 * k];
        return;
    }
    for (int k = 0; k < nops; ++k) off[k] = (ulong)m[1 + r + k * (r + 1)];
    for (int d = r - 1; d >= 0; --d) {
        ulong dim = (ulong)m[1 + d];
        ulong idx = o % dim;
        o /= dim;
        for (int k = 0; k < nops; ++k) off[k] += idx * (ulong)m[1 + r + k * (r + 1) + 1 + d];
    }
}

// Grid-stride loop: the launch covers at most a bounded number of work items, each of which
// walks the index space in steps of the launch's size.
#define FOR_EACH(i, n) for (ulong i = get_global_id(0); i < (n); i += get_global_size(0))

// The summation order (docs/OPS.md): element j into accumulator j mod 16, then the lanes
// folded as a tree, w = 8, 4, 2, 1.
float fold_lanes(float* acc) {
    for (int w = 8; w >= 1; w >>= 1)
        for (int l = 0; l < w; ++l) acc[l] = acc[l] + acc[l + w];
    return acc[0];
}

// Quantised blocks (`tenet_reference::quant`): `b` points at a block of format `fmt` (Q_*
// codes, the IR's `QuantFormat` tags). Its f16 scale `d` and Q4_1's minimum `m` convert
// exactly; element `e` (0..32) is one rounded operation or two, never fused (the source
// starts with FP_CONTRACT OFF): Q4_0 `(q - 8) * d`, Q4_1 `d * q + m`, Q8_0 `(signed q) * d`,
// with the 4-bit `q` the low nibble of byte `e` for e < 16, the high nibble of byte e - 16
// above. NaNs are made canonical where the value is stored (`st_f`).
// One definition for blocks in global memory (`q_half`, `q_value`, `q_min`) and in local
// memory (`q_half_l`, ...: the few-row product stages its weights there).
#define Q_BLOCK_FUNCS(SPACE, SUFFIX)                                                         \
    float q_half##SUFFIX(SPACE const uchar* b) {                                             \
        return tn_f16_to_f32((ushort)b[0] | ((ushort)b[1] << 8));                            \
    }                                                                                        \
    float q_value##SUFFIX(SPACE const uchar* b, int fmt, float d, float m, uint e) {         \
        if (fmt == Q_Q8_0) return convert_float((int)(char)b[2 + e]) * d;                    \
        const uint byte = b[(fmt == Q_Q4_1 ? 4u : 2u) + (e & 15u)];                          \
        const uint q = e < 16u ? (byte & 15u) : (byte >> 4);                                 \
        if (fmt == Q_Q4_0) return convert_float((int)q - 8) * d;                             \
        return d * convert_float((int)q) + m;                                                \
    }                                                                                        \
    /* The minimum `m` of a block (Q4_1's second f16), or +0 for formats without one. */     \
    float q_min##SUFFIX(SPACE const uchar* b, int fmt) {                                     \
        return fmt == Q_Q4_1 ? q_half##SUFFIX(b + 2) : 0.0f;                                 \
    }
Q_BLOCK_FUNCS(global, )
Q_BLOCK_FUNCS(local, _l)
#undef Q_BLOCK_FUNCS
