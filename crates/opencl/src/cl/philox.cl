// tenet: Philox-4x32-10 and the random ops' element values, ported from
// crates/reference/src/philox.rs and the `Random` op in crates/reference/src/interp.rs. A pure
// function of (seed, key, element index), so every work-item computes its own element and
// every device gets the reference's bits.

// Ten rounds of Philox-4x32 on `counter` under `key` (Salmon et al.; Random123's constants).
uint4 tn_philox4x32_10(uint4 counter, uint2 key) {
    uint4 c = counter;
    uint2 k = key;
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k.x += 0x9e3779b9u;
            k.y += 0xbb67ae85u;
        }
        ulong p0 = (ulong)0xd2511f53u * (ulong)c.x;
        ulong p1 = (ulong)0xcd9e8d57u * (ulong)c.z;
        uint hi0 = (uint)(p0 >> 32), lo0 = (uint)p0;
        uint hi1 = (uint)(p1 >> 32), lo1 = (uint)p1;
        c = (uint4)(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    }
    return c;
}

// The four words for element `index` of a random op with `key`, in a job seeded `seed`
// (philox.rs `words`): counter = (index lo, index hi, key lo, key hi), key = (seed lo, seed hi).
uint4 tn_philox_words(ulong seed, ulong key, ulong index) {
    uint4 counter = (uint4)((uint)index, (uint)(index >> 32), (uint)key, (uint)(key >> 32));
    uint2 k = (uint2)((uint)seed, (uint)(seed >> 32));
    return tn_philox4x32_10(counter, k);
}

// random_uniform's element: the top 24 bits of the first word times 2^-24, in [0, 1).
float tn_random_uniform(ulong seed, ulong key, ulong index) {
    uint4 w = tn_philox_words(seed, key, index);
    // Below 2^24: the conversion is exact; the scaling by 2^-24 is exact.
    return (float)(w.x >> 8) * 5.9604644775390625e-8f;
}

// random_normal's element: Box-Muller on u1 in (0, 1] and u2 in [0, 1) with the project's
// log and cos, in the reference's order: sqrt(-2 log u1) * cos(2 pi u2).
float tn_random_normal(ulong seed, ulong key, ulong index) {
    uint4 w = tn_philox_words(seed, key, index);
    float u1 = (float)((w.x >> 8) + 1u) * 5.9604644775390625e-8f;
    float u2 = (float)(w.y >> 8) * 5.9604644775390625e-8f;
    // 6.2831855 = f32(2 pi).
    return sqrt(-2.0f * tn_log(u1)) * tn_cos(as_float(0x40c90fdbu) * u2);
}
