// Elementwise ops, casts, movement and sources: one work item per output element (in
// grid-stride loops), each computing exactly what the reference's per-element code computes
// (float arithmetic through the library's `tn_unary`, `tn_binary` and `tn_compare`, which
// port the reference's `unary_f32`, `binary_f32` and comparisons).
// Integer arithmetic runs in 64 bits on unsigned values (wrapping, never C's undefined signed
// overflow) and is truncated when stored, which is what the reference's i64 arithmetic
// followed by `ints_to` gives for every integer dtype.

long wrap_neg(long a) { return as_long(0ul - (ulong)a); }

long unary_i(int op, long a) {
    switch (op) {
    case U_NEG: return wrap_neg(a);
    case U_ABS: return a < 0 ? wrap_neg(a) : a;
    case U_SIGN: return a > 0 ? 1 : (a < 0 ? -1 : 0);
    default: return a > 0 ? a : 0; // relu, the only other op on integers
    }
}

kernel void k_unary(global uchar* out, global const uchar* x, ulong n, int op, int dt) {
    FOR_EACH(i, n) {
        if (op == U_NOT) {
            out[i] = (uchar)(x[i] == 0);
        } else if (is_float_dt(dt) && (op == U_NEG || op == U_ABS)) {
            // Sign-bit operations: NaN payloads untouched.
            if (dt == DT_F32) {
                uint b = ((global const uint*)x)[i];
                ((global uint*)out)[i] = op == U_NEG ? b ^ 0x80000000u : b & 0x7fffffffu;
            } else {
                ushort b = ((global const ushort*)x)[i];
                ((global ushort*)out)[i] =
                    op == U_NEG ? (ushort)(b ^ 0x8000u) : (ushort)(b & 0x7fffu);
            }
        } else if (is_float_dt(dt)) {
            st_f(out, dt, i, tn_unary(op, ld_f(x, dt, i)));
        } else {
            st_i(out, dt, i, unary_i(op, ld_i(x, dt, i)));
        }
    }
}

long binary_i(int op, long p, long q) {
    switch (op) {
    case B_ADD: return as_long((ulong)p + (ulong)q);
    case B_SUB: return as_long((ulong)p - (ulong)q);
    case B_MUL: return as_long((ulong)p * (ulong)q);
    case B_DIV:
        if (q == 0) return 0;
        if (q == -1) return wrap_neg(p);
        return p / q;
    case B_MAX: return p > q ? p : q;
    case B_MIN: return p < q ? p : q;
    case B_AND: return (p != 0) && (q != 0);
    default: return (p != 0) || (q != 0); // or
    }
}

bool cmp_i(int op, long p, long q) {
    switch (op) {
    case B_EQ: return p == q;
    case B_NE: return p != q;
    case B_LT: return p < q;
    case B_LE: return p <= q;
    case B_GT: return p > q;
    default: return p >= q;
    }
}

bool is_comparison(int op) {
    return op == B_EQ || op == B_NE || op == B_LT || op == B_LE || op == B_GT || op == B_GE;
}

// `dt` is the operands' dtype; comparisons write bools.
kernel void k_binary(global uchar* out, global const uchar* a, global const uchar* b, ulong n,
                      int op, int dt, global const long* meta, uint mo) {
    global const long* m = meta + mo;
    FOR_EACH(i, n) {
        ulong off[2];
        view_offsets(m, i, 2, off);
        if (is_float_dt(dt)) {
            float p = ld_f(a, dt, off[0]), q = ld_f(b, dt, off[1]);
            if (is_comparison(op)) out[i] = (uchar)tn_compare(op, p, q);
            else st_f(out, dt, i, tn_binary(op, p, q));
        } else {
            long p = ld_i(a, dt, off[0]), q = ld_i(b, dt, off[1]);
            if (is_comparison(op)) out[i] = (uchar)cmp_i(op, p, q);
            else st_i(out, dt, i, binary_i(op, p, q));
        }
    }
}

kernel void k_where(global uchar* out, global const uchar* c, global const uchar* a,
                     global const uchar* b, ulong n, int esize, global const long* meta,
                     uint mo) {
    global const long* m = meta + mo;
    FOR_EACH(i, n) {
        ulong off[3];
        view_offsets(m, i, 3, off);
        if (c[off[0]] != 0) copy_el(out, i, a, off[1], esize);
        else copy_el(out, i, b, off[2], esize);
    }
}

// float → integer: truncate toward zero, saturate at the target's bounds, NaN → 0 (Rust's
// `as`, which the reference uses).
long f2i(float v, int dto) {
    if (tn_is_nan(v)) return 0;
    if (dto == DT_I32) {
        if (v >= 2147483648.0f) return 2147483647L;
        if (v <= -2147483648.0f) return -2147483648L;
        return (long)convert_int_rtz(v);
    }
    if (dto == DT_U8) {
        if (v >= 255.0f) return 255;
        if (v <= 0.0f) return 0;
        return (long)convert_int_rtz(v);
    }
    if (v >= 9223372036854775808.0f) return 9223372036854775807L;
    if (v <= -9223372036854775808.0f) return -9223372036854775807L - 1;
    return convert_long_rtz(v);
}

// Between different dtypes (equal dtypes alias the operand).
kernel void k_cast(global uchar* out, global const uchar* x, ulong n, int dti, int dto) {
    FOR_EACH(i, n) {
        if (dto == DT_BOOL) {
            out[i] = is_float_dt(dti) ? (uchar)(ld_f(x, dti, i) != 0.0f)
                                      : (uchar)(ld_i(x, dti, i) != 0);
        } else if (is_float_dt(dto)) {
            // int → float rounds to nearest even in f32 (then once more to a half type).
            float v = is_float_dt(dti) ? ld_f(x, dti, i) : convert_float_rte(ld_i(x, dti, i));
            st_f(out, dto, i, v);
        } else if (is_float_dt(dti)) {
            st_i(out, dto, i, f2i(ld_f(x, dti, i), dto));
        } else {
            st_i(out, dto, i, ld_i(x, dti, i));
        }
    }
}

// Movement: element bits copied between two strided views (meta: destination first).
kernel void k_copy(global uchar* out, global const uchar* x, ulong n, int esize,
                    global const long* meta, uint mo) {
    global const long* m = meta + mo;
    FOR_EACH(i, n) {
        ulong off[2];
        view_offsets(m, i, 2, off);
        copy_el(out, off[0], x, off[1], esize);
    }
}

void zero_el(global uchar* dst, ulong di, int size) {
    if (size == 4) ((global uint*)dst)[di] = 0;
    else if (size == 2) ((global ushort*)dst)[di] = 0;
    else if (size == 8) ((global ulong*)dst)[di] = 0;
    else dst[di] = 0;
}

// The index at position `ip`, counted from the end when negative; -1 when out of range.
long gather_at(global const uchar* ind, int idt, ulong ip, long size_a, long* raw) {
    long r = ld_i(ind, idt, ip);
    *raw = r;
    long v = r < 0 ? r + size_a : r;
    return (v < 0 || v >= size_a) ? -1 : v;
}

// numpy take: out[p, ip, q] = x[p, ind[ip], q]. An out-of-range index writes zeros here; the
// run reports it through `k_gather_check`.
kernel void k_gather(global uchar* out, global const uchar* x, global const uchar* ind, ulong n,
                      ulong idx_n, ulong post, long size_a, int idt, int esize) {
    FOR_EACH(o, n) {
        ulong q = o % post, t = o / post;
        ulong ip = t % idx_n, p = t / idx_n;
        long raw;
        long v = gather_at(ind, idt, ip, size_a, &raw);
        if (v < 0) zero_el(out, o, esize);
        else copy_el(out, o, x, (p * (ulong)size_a + (ulong)v) * post + q, esize);
    }
}

// The first out-of-range position of the indices (what the reference reports first, in
// output order), kept in flags[slot] by atomic minimum.
kernel void k_gather_check(global const uchar* ind, ulong idx_n, long size_a, int idt,
                            volatile global int* flags, int slot) {
    FOR_EACH(ip, idx_n) {
        long raw;
        if (gather_at(ind, idt, ip, size_a, &raw) < 0) atomic_min(&flags[slot], (int)ip);
    }
}

// One work item: the raw index value at the position `k_gather_check` found.
kernel void k_gather_fetch(global const uchar* ind, int idt, global const int* flags,
                            global long* vals, int slot) {
    if (get_global_id(0) == 0) {
        int p = flags[slot];
        if (p != 0x7fffffff) vals[slot] = ld_i(ind, idt, (ulong)p);
    }
}

kernel void k_iota(global uchar* out, ulong n, ulong inner, ulong dim, int dt) {
    FOR_EACH(i, n) {
        long v = (long)((i / inner) % dim);
        if (is_float_dt(dt)) st_f(out, dt, i, convert_float_rte(v));
        else st_i(out, dt, i, v);
    }
}

kernel void k_tri_mask(global uchar* out, ulong n, ulong rows, ulong cols, int upper,
                        long diag) {
    FOR_EACH(o, n) {
        long j = (long)(o % cols), i = (long)((o / cols) % rows);
        long d = j - i; // |d| < 2^40: `j >= i + diag` without overflow
        out[o] = (uchar)(upper ? d >= diag : d <= diag);
    }
}

kernel void k_random(global uchar* out, ulong n, int dist, int dt, ulong seed, ulong key) {
    FOR_EACH(i, n) {
        float v = dist == D_RANDOM_UNIFORM ? tn_random_uniform(seed, key, i)
                                           : tn_random_normal(seed, key, i);
        st_f(out, dt, i, v);
    }
}
