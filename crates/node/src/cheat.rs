//! A node that lies, on purpose: for `tenet demo` and the coordinator's tests, which must show
//! liars caught and slashed. Off unless the operator asks (`--cheat MODE`), and announced
//! loudly when on. The lie is applied to the outputs after an honest run and before they are
//! hashed and committed, so the node's commitment is a real signature over a wrong result.

use tenet_ir::{DType, HostTensor};

/// How a cheating node corrupts its results.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Cheat {
    /// Flip the lowest mantissa bit of the first float element: the smallest possible lie.
    Flip,
    /// Add `amplitude` × a fixed pseudo-random pattern in [-1, 1] to every float element.
    Noise(f32),
    /// Add 1 to the first float element: colluding nodes told to cheat this way agree.
    Collude,
    /// Compute and commit honestly, then never answer the reveal: a node stalling a job.
    Withhold,
    /// Lie at one op deep inside the graph: flip the lowest bit of node `%K`'s first byte as
    /// the job runs (on the reference interpreter), so every later value, the outputs and the
    /// node's trace all follow from the lie — what a dispute by bisection must pin down. In
    /// every graph job, or (`op=K@N`) only in the `N`th graph job this node runs.
    Op { node: u32, job: Option<u64> },
    /// `stall=K`: lie at node `%K` as `op=K` does, then never answer a dispute's questions
    /// about the trace (it must lose by rule, not hang the coordinator).
    Stall(u32),
}

impl Cheat {
    /// Parse `flip`, `noise=AMPLITUDE`, `collude`, `withhold`, `op=K`, `op=K@N` or `stall=K`.
    pub fn parse(text: &str) -> Option<Cheat> {
        match text {
            "flip" => Some(Cheat::Flip),
            "collude" => Some(Cheat::Collude),
            "withhold" => Some(Cheat::Withhold),
            _ if text.starts_with("stall=") => text[6..].parse().ok().map(Cheat::Stall),
            _ if text.starts_with("op=") => {
                let (node, job) = match text[3..].split_once('@') {
                    Some((k, n)) => (k.parse().ok()?, Some(n.parse().ok().filter(|&n| n > 0)?)),
                    None => (text[3..].parse().ok()?, None),
                };
                Some(Cheat::Op { node, job })
            }
            _ => {
                let amp: f32 = text.strip_prefix("noise=")?.parse().ok()?;
                (amp.is_finite() && amp > 0.0).then_some(Cheat::Noise(amp))
            }
        }
    }

    /// Corrupt `t` (f32 tensors, and i64 ones such as a generation's tokens: the first token
    /// changes, or every one for `noise`; others are left alone; a withholding node's results
    /// are honest).
    pub fn apply(self, t: HostTensor) -> HostTensor {
        if t.numel() == 0 || matches!(self, Cheat::Withhold | Cheat::Op { .. } | Cheat::Stall(_)) {
            return t;
        }
        if t.dtype() == DType::I64 {
            let ty = t.ty().clone();
            let mut v = t.to_i64_vec();
            match self {
                Cheat::Flip => v[0] ^= 1,
                Cheat::Collude => v[0] += 1,
                _ => v.iter_mut().for_each(|x| *x ^= 1),
            }
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            return HostTensor::new(ty, bytes)
                .unwrap_or_else(|e| panic!("same type, same size: {e}"));
        }
        if t.dtype() != DType::F32 {
            return t;
        }
        let ty = t.ty().clone();
        let mut v = t.to_f32_vec();
        match self {
            Cheat::Flip => v[0] = f32::from_bits(v[0].to_bits() ^ 1),
            Cheat::Collude => v[0] += 1.0,
            Cheat::Withhold | Cheat::Op { .. } | Cheat::Stall(_) => {}
            Cheat::Noise(amp) => {
                let mut state = 0x9E37_79B9u32;
                for x in &mut v {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    *x += amp * (state as f32 / u32::MAX as f32 * 2.0 - 1.0);
                }
            }
        }
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        HostTensor::new(ty, bytes).unwrap_or_else(|e| panic!("same type, same size: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_change_the_result() {
        assert_eq!(Cheat::parse("flip"), Some(Cheat::Flip));
        assert_eq!(Cheat::parse("noise=0.5"), Some(Cheat::Noise(0.5)));
        assert_eq!(Cheat::parse("noise=-1"), None);
        assert_eq!(Cheat::parse("lie"), None);
        assert_eq!(Cheat::parse("withhold"), Some(Cheat::Withhold));
        let honest = HostTensor::from_f32(&[2], &[1.0, 2.0]).unwrap();
        assert_eq!(Cheat::Withhold.apply(honest.clone()), honest);
        let t = HostTensor::from_f32(&[3], &[1.0, 2.0, 3.0]).unwrap();
        for c in [Cheat::Flip, Cheat::Collude, Cheat::Noise(0.1)] {
            let lied = c.apply(t.clone());
            assert_ne!(lied.bytes(), t.bytes(), "{c:?}");
            assert_eq!(lied.ty(), t.ty());
        }
        let tokens = HostTensor::from_i64(&[2], &[7, 9]).unwrap();
        for c in [Cheat::Flip, Cheat::Collude, Cheat::Noise(0.1)] {
            assert_ne!(c.apply(tokens.clone()).bytes(), tokens.bytes(), "{c:?}");
        }
        let n = Cheat::Noise(0.1).apply(t.clone()).to_f32_vec();
        assert!(
            n.iter()
                .zip([1.0, 2.0, 3.0])
                .all(|(a, b)| (a - b).abs() <= 0.1)
        );
        assert_eq!(
            Cheat::Collude.apply(t.clone()).bytes(),
            Cheat::Collude.apply(t).bytes()
        );
    }
}
