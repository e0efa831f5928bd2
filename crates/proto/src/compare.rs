//! Deciding agreement among replicas' results — the same rules whoever decides: the coordinator,
//! or a caller on the peer-to-peer network with none.
//!
//! `exact`: results agree when their output hashes are equal; a strict majority of the
//! compared replicas decides. `tolerant`: the element-wise median of all replicas is the
//! yardstick (never a mean or a summed distance, which one large liar or a colluding majority
//! can drag); a replica agrees when every element is within the bound of the median, and the
//! agreeing replica nearest the median is the result.

use crate::Hash;
use tenet_ir::HostTensor;

/// One replica's revealed result.
#[derive(Clone, Debug)]
pub struct Replica {
    pub node: String,
    pub output_hash: Hash,
    pub outputs: Vec<(String, HostTensor)>,
}

/// How the comparison came out.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// Index into the replicas of the result to return; `None` when no majority agrees.
    pub result: Option<usize>,
    /// Per replica: agreed with the result, and its score (1 or 0 in `exact`; 1/(1+distance)
    /// in `tolerant`).
    pub agreed: Vec<bool>,
    pub scores: Vec<f64>,
}

/// Exact tier: the output hash a strict majority share, if any.
pub fn exact(replicas: &[Replica]) -> Decision {
    let n = replicas.len();
    let winner = (0..n).find(|&i| {
        let same = replicas
            .iter()
            .filter(|r| r.output_hash == replicas[i].output_hash)
            .count();
        same * 2 > n
    });
    decide_by_hash(replicas, winner.map(|i| replicas[i].output_hash), winner)
}

/// Agreement with a hash chosen elsewhere (a referee's run).
pub fn decide_by_hash(replicas: &[Replica], hash: Option<Hash>, result: Option<usize>) -> Decision {
    let agreed: Vec<bool> = replicas
        .iter()
        .map(|r| Some(r.output_hash) == hash)
        .collect();
    let scores = agreed.iter().map(|&a| if a { 1.0 } else { 0.0 }).collect();
    let result = result.or_else(|| agreed.iter().position(|&a| a));
    Decision {
        result,
        agreed,
        scores,
    }
}

fn median(v: &mut [f32]) -> f32 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Tolerant tier: agreement within `bound` of the element-wise median.
pub fn tolerant(replicas: &[Replica], bound: f64) -> Decision {
    let n = replicas.len();
    // Replicas whose outputs do not even have the reference's names and types cannot agree.
    let shape_of = |r: &Replica| -> Vec<(String, tenet_ir::TensorType)> {
        r.outputs
            .iter()
            .map(|(n, t)| (n.clone(), t.ty().clone()))
            .collect()
    };
    let shapes: Vec<_> = replicas.iter().map(shape_of).collect();
    let common = (0..n)
        .max_by_key(|&i| shapes.iter().filter(|s| **s == shapes[i]).count())
        .map(|i| shapes[i].clone());
    let mut distance = vec![f64::INFINITY; n];
    if let Some(common) = common {
        let members: Vec<usize> = (0..n).filter(|&i| shapes[i] == common).collect();
        let mut worst = vec![0f64; n];
        for (o, _) in common.iter().enumerate() {
            let values: Vec<Vec<f32>> = members
                .iter()
                .map(|&i| replicas[i].outputs[o].1.to_f32_vec())
                .collect();
            let len = values[0].len();
            let mut column = vec![0f32; members.len()];
            for e in 0..len {
                for (k, v) in values.iter().enumerate() {
                    column[k] = v[e];
                }
                let m = median(&mut column);
                for (k, &i) in members.iter().enumerate() {
                    let d = (values[k][e] - m).abs() as f64;
                    // NaN never agrees with anything.
                    worst[i] = if d.is_nan() {
                        f64::INFINITY
                    } else {
                        worst[i].max(d)
                    };
                }
            }
        }
        for &i in &members {
            distance[i] = worst[i];
        }
    }
    let agreed: Vec<bool> = distance.iter().map(|&d| d <= bound).collect();
    let scores = distance.iter().map(|&d| 1.0 / (1.0 + d)).collect();
    let count = agreed.iter().filter(|&&a| a).count();
    let result = (count * 2 > n)
        .then(|| {
            (0..n)
                .filter(|&i| agreed[i])
                .min_by(|&a, &b| distance[a].total_cmp(&distance[b]))
        })
        .flatten();
    Decision {
        result,
        agreed,
        scores,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(node: &str, values: &[f32]) -> Replica {
        let t = HostTensor::from_f32(&[values.len() as u64], values).unwrap();
        Replica {
            node: node.into(),
            output_hash: Hash(t.hash()),
            outputs: vec![("y".into(), t)],
        }
    }

    #[test]
    fn exact_needs_a_strict_majority() {
        let d = exact(&[
            replica("a", &[1.0]),
            replica("b", &[1.0]),
            replica("c", &[2.0]),
        ]);
        assert_eq!(d.result, Some(0));
        assert_eq!(d.agreed, [true, true, false]);
        let d = exact(&[replica("a", &[1.0]), replica("b", &[2.0])]);
        assert_eq!(d.result, None, "a tie decides nothing");
        // Two colluders of five are outvoted.
        let five = [1.0, 1.0, 1.0, 9.0, 9.0].map(|v| replica("n", &[v]));
        let d = exact(&five);
        assert_eq!(d.agreed, [true, true, true, false, false]);
    }

    #[test]
    fn tolerant_measures_against_the_median_not_the_mean() {
        let rs = [
            replica("a", &[1.0, 2.0]),
            replica("b", &[1.0 + 1e-6, 2.0]),
            replica("c", &[1.0, 2.0 - 1e-6]),
            replica("liar", &[1000.0, 2.0]),
        ];
        let d = tolerant(&rs, 1e-4);
        assert_eq!(d.agreed, [true, true, true, false]);
        assert!(d.result.is_some());
        assert!(d.scores[3] < 0.01 && d.scores[0] > 0.99);
        // A NaN never agrees, and a wrong shape cannot.
        let d = tolerant(
            &[
                replica("a", &[1.0]),
                replica("b", &[1.0]),
                replica("c", &[f32::NAN]),
            ],
            1.0,
        );
        assert_eq!(d.agreed, [true, true, false]);
        let d = tolerant(
            &[
                replica("a", &[1.0]),
                replica("b", &[1.0]),
                replica("c", &[1.0, 2.0]),
            ],
            1.0,
        );
        assert_eq!(d.agreed, [true, true, false]);
    }
}
