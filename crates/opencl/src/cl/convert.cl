// tenet: storage-dtype conversions (f16, bf16 <-> f32), bit for bit as the Rust `half` crate
// (2.x) converts, since the reference encodes and decodes every f16/bf16 tensor with it.
//
// Written with integer operations only: OpenCL's vload_half/vstore_half choose their own
// rounding and NaN payloads per device, and a device that flushes denormals would flush the
// f16 subnormals a float route passes through.
//
// NaNs: `half` keeps the top payload bits and sets the quiet bit, in both directions; finite
// values round to nearest, ties to even; overflow gives infinity, underflow signed zero.

// f16 bits -> f32 (exact: every f16 is an f32).
float tn_f16_to_f32(ushort h) {
    uint i = (uint)h;
    uint sign = (i & 0x8000u) << 16;
    uint exp = i & 0x7c00u;
    uint man = i & 0x03ffu;
    if ((i & 0x7fffu) == 0u) {
        return as_float(sign);
    }
    if (exp == 0x7c00u) {
        // Infinity, or NaN with the payload kept and the quiet bit set (as `half` does).
        return man == 0u ? as_float(sign | 0x7f800000u)
                         : as_float(sign | 0x7fc00000u | (man << 13));
    }
    if (exp == 0u) {
        // Subnormal: normalise. e = leading zeros of the 10-bit mantissa in a 16-bit word - 6.
        uint e = (uint)clz(man) - 16u - 6u;
        uint fexp = (127u - 15u - e) << 23;
        uint fman = (man << (14u + e)) & 0x007fffffu;
        return as_float(sign | fexp | fman);
    }
    return as_float(sign | ((exp >> 10) - 15u + 127u) << 23 | (man << 13));
}

// f32 -> f16 bits, round to nearest even (half's `f32_to_f16_fallback`, which its F16C
// hardware path agrees with).
ushort tn_f32_to_f16(float f) {
    uint x = as_uint(f);
    uint sign = x & 0x80000000u;
    uint exp = x & 0x7f800000u;
    uint man = x & 0x007fffffu;
    uint hsign = sign >> 16;
    if (exp == 0x7f800000u) {
        // Infinity, or NaN: the top 10 payload bits kept, the quiet bit set.
        uint nan_bit = man == 0u ? 0u : 0x0200u;
        return (ushort)(hsign | 0x7c00u | nan_bit | (man >> 13));
    }
    int half_exp = (int)(exp >> 23) - 127 + 15;
    if (half_exp >= 0x1f) {
        return (ushort)(hsign | 0x7c00u);
    }
    if (half_exp <= 0) {
        if (14 - half_exp > 24) {
            // Below half the smallest subnormal: signed zero.
            return (ushort)hsign;
        }
        uint m = man | 0x00800000u;
        uint hman = m >> (uint)(14 - half_exp);
        uint round_bit = 1u << (uint)(13 - half_exp);
        // Round up when the round bit is set and either a lower bit or the result's last bit
        // is (ties to even).
        if ((m & round_bit) != 0u && (m & (3u * round_bit - 1u)) != 0u) {
            hman += 1u;
        }
        return (ushort)(hsign | hman);
    }
    uint h = hsign | ((uint)half_exp << 10) | (man >> 13);
    uint round_bit = 0x00001000u;
    if ((man & round_bit) != 0u && (man & (3u * round_bit - 1u)) != 0u) {
        // A carry out of the mantissa correctly bumps the exponent (up to infinity).
        h += 1u;
    }
    return (ushort)h;
}

// bf16 bits -> f32 (exact; a NaN gets its quiet bit set, as in `half`).
float tn_bf16_to_f32(ushort b) {
    uint i = (uint)b;
    if ((i & 0x7fffu) > 0x7f80u) {
        return as_float((i | 0x0040u) << 16);
    }
    return as_float(i << 16);
}

// f32 -> bf16 bits, round to nearest even; a NaN keeps its top payload bits, quiet bit set.
ushort tn_f32_to_bf16(float f) {
    uint x = as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (ushort)((x >> 16) | 0x0040u);
    }
    uint round_bit = 0x00008000u;
    if ((x & round_bit) != 0u && (x & (3u * round_bit - 1u)) != 0u) {
        return (ushort)((x >> 16) + 1u);
    }
    return (ushort)(x >> 16);
}
