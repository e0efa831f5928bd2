//! Is honesty the best strategy for a node? The spot-check model of EigenTensor's security
//! section: a job goes to one node and is checked by others with probability α. For a node with
//! stake S, payment P per job, computation cost C, cheating cost εC, other checkers colluding
//! against it with probability β, and a cheat being caught when checked with probability γ:
//!
//! ```text
//! EV(honest)    = (1-α)(P-C)  + α(1-β)(P-C)  - αβS   = (P-C)  - αβ(P-C+S)
//! EV(dishonest) = (1-α)(P-εC) + α(1-γ)(P-εC) - αγS   = (P-εC) - αγ(P-εC+S)
//! ```
//!
//! Honesty dominates when EV(honest) ≥ EV(dishonest), that is when
//! `α · (γ(P-εC+S) - β(P-C+S)) ≥ (1-ε)C`. The smallest such α is the check rate to configure;
//! if the bracket is not positive, or the α it asks for is above 1, no check rate makes honesty
//! pay — raise the stake, lower collusion, or check every job with more replicas.

/// The model's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    /// S: stake at risk.
    pub stake: f64,
    /// P: payment per job.
    pub payment: f64,
    /// C: cost of computing a job honestly.
    pub cost: f64,
    /// α: probability a job is checked.
    pub alpha: f64,
    /// β: probability the checkers collude against an honest node.
    pub collusion: f64,
    /// γ: probability a cheat is caught when checked.
    pub catch: f64,
    /// ε: cheating costs εC (ε ≪ 1; 0 = free).
    pub epsilon: f64,
}

/// What the model says.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    pub ev_honest: f64,
    pub ev_dishonest: f64,
    /// Honesty pays at least as much as cheating at this α.
    pub honest_dominant: bool,
    /// The smallest α in [0, 1] at which honesty dominates, if any.
    pub min_alpha: Option<f64>,
}

/// A parameter outside its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParamError {
    #[error("{name} must be a probability in [0, 1], not {value}")]
    NotProbability { name: &'static str, value: f64 },
    #[error("{name} must be a finite number ≥ 0, not {value}")]
    Negative { name: &'static str, value: f64 },
}

impl Params {
    fn check(&self) -> Result<(), ParamError> {
        for (name, value) in [
            ("--alpha", self.alpha),
            ("--collusion", self.collusion),
            ("--catch", self.catch),
            ("--epsilon", self.epsilon),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(ParamError::NotProbability { name, value });
            }
        }
        for (name, value) in [
            ("--stake", self.stake),
            ("--payment", self.payment),
            ("--cost", self.cost),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(ParamError::Negative { name, value });
            }
        }
        Ok(())
    }

    fn ev_honest(&self, alpha: f64) -> f64 {
        let (s, p, c, b) = (self.stake, self.payment, self.cost, self.collusion);
        (1.0 - alpha) * (p - c) + alpha * (1.0 - b) * (p - c) - alpha * b * s
    }

    fn ev_dishonest(&self, alpha: f64) -> f64 {
        let (s, p, g) = (self.stake, self.payment, self.catch);
        let cheap = self.epsilon * self.cost;
        (1.0 - alpha) * (p - cheap) + alpha * (1.0 - g) * (p - cheap) - alpha * g * s
    }

    /// Evaluate the model.
    pub fn verdict(&self) -> Result<Verdict, ParamError> {
        self.check()?;
        let (s, p, c) = (self.stake, self.payment, self.cost);
        let gain = (1.0 - self.epsilon) * c;
        let slope = self.catch * (p - self.epsilon * c + s) - self.collusion * (p - c + s);
        let min_alpha = if gain <= 0.0 {
            Some(0.0)
        } else if slope > 0.0 && gain / slope <= 1.0 {
            Some(gain / slope)
        } else {
            None
        };
        let (h, d) = (self.ev_honest(self.alpha), self.ev_dishonest(self.alpha));
        Ok(Verdict {
            ev_honest: h,
            ev_dishonest: d,
            honest_dominant: h >= d,
            min_alpha,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Params {
        Params {
            stake: 1000.0,
            payment: 1.0,
            cost: 0.5,
            alpha: 0.1,
            collusion: 0.05,
            catch: 0.99,
            epsilon: 0.0,
        }
    }

    #[test]
    fn the_threshold_is_where_the_two_strategies_pay_the_same() {
        let p = base();
        let v = p.verdict().unwrap();
        let a = v.min_alpha.unwrap();
        // 0.5 / (0.99 · 1001 − 0.05 · 1000.5) = 0.5 / 940.965
        assert!((a - 0.5 / 940.965).abs() < 1e-12, "{a}");
        let at = Params { alpha: a, ..p };
        assert!((at.ev_honest(a) - at.ev_dishonest(a)).abs() < 1e-9);
        assert!(
            !Params {
                alpha: a * 0.9,
                ..p
            }
            .verdict()
            .unwrap()
            .honest_dominant
        );
        assert!(
            Params {
                alpha: a * 1.1,
                ..p
            }
            .verdict()
            .unwrap()
            .honest_dominant
        );
        assert!(v.honest_dominant, "α = 0.1 is far above the threshold");
        assert!((v.ev_honest - (0.5 - 0.1 * 0.05 * 1000.5)).abs() < 1e-9);
    }

    #[test]
    fn no_check_rate_helps_when_collusion_outweighs_catching() {
        let p = Params {
            collusion: 0.6,
            catch: 0.5,
            ..base()
        };
        assert_eq!(p.verdict().unwrap().min_alpha, None);
        // A tiny stake: even checking every job cannot deter cheating.
        let p = Params {
            stake: 0.0,
            payment: 1.0,
            cost: 0.9,
            catch: 0.5,
            collusion: 0.0,
            ..base()
        };
        assert_eq!(p.verdict().unwrap().min_alpha, None);
        // Free computation: nothing to gain by cheating.
        let p = Params {
            cost: 0.0,
            ..base()
        };
        assert_eq!(p.verdict().unwrap().min_alpha, Some(0.0));
    }

    #[test]
    fn parameters_out_of_range_are_named() {
        let e = Params {
            alpha: 1.5,
            ..base()
        }
        .verdict()
        .unwrap_err();
        assert_eq!(
            e,
            ParamError::NotProbability {
                name: "--alpha",
                value: 1.5
            }
        );
        let e = Params {
            stake: -1.0,
            ..base()
        }
        .verdict()
        .unwrap_err();
        assert!(e.to_string().contains("--stake"));
        assert!(
            Params {
                cost: f64::NAN,
                ..base()
            }
            .verdict()
            .is_err()
        );
    }
}
