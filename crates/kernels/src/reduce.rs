//! Sums and means over any axes, with the reference's bits: every output is the ordered sum of
//! its elements (element `j` into lane `j mod 16`, the 16 lanes folded 8, 4, 2, 1; docs/OPS.md,
//! "Summation order"), made fast by the layout instead of by reordering.
//!
//! - When 16 consecutive outputs read 16 consecutive inputs for every reduced position (a
//!   reduction over outer axes, such as mean pooling over a sequence), they are summed side by
//!   side: 16 lanes × 16 outputs of accumulators, one 16-float load per reduced position.
//! - Otherwise each output runs its own 16 lanes over its elements (contiguous when the reduced
//!   axes are the innermost ones).
//!
//! Plain Rust that the compiler vectorises; the adds are the reference's adds, in its order.

use tenet_reference::fold_lanes;

/// Where an output's elements lie relative to its first one.
#[derive(Clone, Copy, Debug)]
pub enum Reduced<'a> {
    /// Elements `0..n` after it (the reduced axes are the innermost ones).
    Contiguous(usize),
    /// At these offsets, in the reference's order (row-major over the reduced axes).
    Offsets(&'a [usize]),
}

impl Reduced<'_> {
    fn len(&self) -> usize {
        match self {
            Reduced::Contiguous(n) => *n,
            Reduced::Offsets(o) => o.len(),
        }
    }

    fn at(&self, j: usize) -> usize {
        match self {
            Reduced::Contiguous(_) => j,
            Reduced::Offsets(o) => o[j],
        }
    }
}

/// `out[o]` = the ordered sum of `x[kept[o] + reduced(j)]` over `j` (divided by the count when
/// `mean`, as the reference divides), NaNs made canonical. Panics if an offset lies outside
/// `x` or `kept` and `out` differ in length.
pub fn ordered_sums(x: &[f32], kept: &[usize], reduced: Reduced<'_>, mean: bool, out: &mut [f32]) {
    assert_eq!(kept.len(), out.len(), "one kept offset per output");
    let count = reduced.len();
    let finish = |sum: f32| {
        let v = if mean { sum / count as f32 } else { sum };
        if v.is_nan() { f32::NAN } else { v }
    };
    let mut o = 0;
    while o < out.len() {
        let side_by_side = o + 16 <= out.len()
            && kept[o..o + 16]
                .iter()
                .enumerate()
                .all(|(i, &k)| k == kept[o] + i);
        if side_by_side {
            let sums = sixteen_outputs(x, kept[o], reduced);
            for (dst, sum) in out[o..o + 16].iter_mut().zip(sums) {
                *dst = finish(sum);
            }
            o += 16;
        } else {
            out[o] = finish(one_output(x, kept[o], reduced));
            o += 1;
        }
    }
}

/// The ordered sums of outputs whose elements start at `first`, `first + 1`, … `first + 15`.
fn sixteen_outputs(x: &[f32], first: usize, reduced: Reduced<'_>) -> [f32; 16] {
    // acc[lane][output]
    let mut acc = [[0.0f32; 16]; 16];
    for j in 0..reduced.len() {
        let at = first + reduced.at(j);
        let src: &[f32; 16] = x[at..at + 16].try_into().expect("16 elements");
        let lane = &mut acc[j % 16];
        for i in 0..16 {
            lane[i] += src[i];
        }
    }
    // The fold, for all 16 outputs at once: lane l += lane l + w.
    for w in [8, 4, 2, 1] {
        for l in 0..w {
            let (low, high) = acc.split_at_mut(l + w);
            for i in 0..16 {
                low[l][i] += high[0][i];
            }
        }
    }
    acc[0]
}

/// The ordered sum of one output's elements, which start at `first`.
fn one_output(x: &[f32], first: usize, reduced: Reduced<'_>) -> f32 {
    let mut acc = [0.0f32; 16];
    match reduced {
        Reduced::Contiguous(n) => {
            let row = &x[first..first + n];
            let mut blocks = row.chunks_exact(16);
            for block in &mut blocks {
                for l in 0..16 {
                    acc[l] += block[l];
                }
            }
            for (l, v) in blocks.remainder().iter().enumerate() {
                acc[l] += v;
            }
        }
        Reduced::Offsets(offsets) => {
            for (j, &r) in offsets.iter().enumerate() {
                acc[j % 16] += x[first + r];
            }
        }
    }
    fold_lanes(acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenet_reference::sum_ordered;

    fn awkward(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| match i % 23 {
                0 => f32::MIN_POSITIVE / 8.0, // denormal
                5 => -0.0,
                7 => 3.0e38,
                11 => -1.0e-7,
                _ => ((i as u32).wrapping_mul(2654435761) >> 8) as f32 / 16777216.0 - 0.5,
            })
            .collect()
    }

    /// Shape [a, b, c] summed over axis 1 (side by side) and over axis 2 (contiguous), against
    /// the reference's ordered sum, bit for bit.
    #[test]
    fn sums_match_the_reference_bit_for_bit_on_both_paths() {
        for (a, b, c) in [(2, 37, 40), (3, 16, 16), (1, 1, 17), (2, 129, 5)] {
            let x = awkward(a * b * c);
            // Over axis 1: output (i, k) reads x[i·b·c + j·c + k].
            let kept: Vec<usize> = (0..a)
                .flat_map(|i| (0..c).map(move |k| i * b * c + k))
                .collect();
            let red: Vec<usize> = (0..b).map(|j| j * c).collect();
            for mean in [false, true] {
                let mut out = vec![0.0; kept.len()];
                ordered_sums(&x, &kept, Reduced::Offsets(&red), mean, &mut out);
                for (o, &k) in kept.iter().enumerate() {
                    let mut want = sum_ordered(red.iter().map(|&r| x[k + r]));
                    if mean {
                        want /= b as f32;
                    }
                    assert_eq!(
                        out[o].to_bits(),
                        want.to_bits(),
                        "axis 1 of {a}×{b}×{c}, out {o}"
                    );
                }
            }
            // Over axis 2: contiguous rows.
            let rows: Vec<usize> = (0..a * b).map(|r| r * c).collect();
            let mut out = vec![0.0; rows.len()];
            ordered_sums(&x, &rows, Reduced::Contiguous(c), false, &mut out);
            for (o, &k) in rows.iter().enumerate() {
                let want = sum_ordered(x[k..k + c].iter().copied());
                assert_eq!(
                    out[o].to_bits(),
                    want.to_bits(),
                    "axis 2 of {a}×{b}×{c}, out {o}"
                );
            }
        }
    }

    #[test]
    fn nans_come_out_canonical_and_empty_sums_are_zero() {
        let mut x = vec![1.0f32; 32 * 4];
        x[5] = f32::from_bits(0x7fc0_1234);
        let kept: Vec<usize> = (0..32).collect();
        let red: Vec<usize> = (0..4).map(|j| j * 32).collect();
        let mut out = vec![0.0; 32];
        ordered_sums(&x, &kept, Reduced::Offsets(&red), false, &mut out);
        assert_eq!(out[5].to_bits(), f32::NAN.to_bits());
        assert_eq!(out[6], 4.0);
        let mut empty = vec![7.0; 3];
        ordered_sums(&x, &[0, 1, 2], Reduced::Contiguous(0), false, &mut empty);
        assert_eq!(empty, [0.0; 3]);
    }
}
