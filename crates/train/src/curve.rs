//! The training history (each step's loss and accuracy, each evaluation of the test set) and
//! its two pictures of it: a CSV with one row per step, and an SVG line plot drawn by hand
//! (the loss, its moving average, and the test accuracy after each epoch).

use std::fmt::Write;

use serde_json::{Value, json};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    /// Each step's mean loss.
    pub loss: Vec<f32>,
    /// Each step's fraction of rows predicted right.
    pub accuracy: Vec<f32>,
    /// `(step, test accuracy, test loss)` after each epoch.
    pub test: Vec<(u64, f64, f64)>,
}

impl History {
    pub fn to_json(&self) -> Value {
        json!({"loss": self.loss, "accuracy": self.accuracy, "test": self.test})
    }

    pub fn from_json(v: &Value) -> Option<History> {
        // JSON has no NaN: a diverged step's loss was written as null.
        let float = |x: &Value| x.as_f64().or(x.is_null().then_some(f64::NAN));
        let floats = |v: &Value| -> Option<Vec<f32>> {
            v.as_array()?
                .iter()
                .map(|x| float(x).map(|x| x as f32))
                .collect()
        };
        let test = v["test"]
            .as_array()?
            .iter()
            .map(|t| Some((t.get(0)?.as_u64()?, float(t.get(1)?)?, float(t.get(2)?)?)))
            .collect::<Option<Vec<_>>>()?;
        let h = History {
            loss: floats(&v["loss"])?,
            accuracy: floats(&v["accuracy"])?,
            test,
        };
        (h.loss.len() == h.accuracy.len()).then_some(h)
    }

    /// `step,loss,train_accuracy,test_accuracy,test_loss`; the test columns are filled on the
    /// steps that ended an epoch.
    pub fn csv(&self) -> String {
        let mut out = String::from("step,loss,train_accuracy,test_accuracy,test_loss\n");
        for (i, (l, a)) in self.loss.iter().zip(&self.accuracy).enumerate() {
            let step = i as u64 + 1;
            let _ = write!(out, "{step},{l},{a}");
            match self.test.iter().find(|t| t.0 == step) {
                Some((_, ta, tl)) => {
                    let _ = writeln!(out, ",{ta},{tl}");
                }
                None => out.push_str(",,\n"),
            }
        }
        out
    }

    /// An 800×400 SVG: loss (left axis, grey per step, blue moving average) and test accuracy
    /// (right axis, 0–1, red points) against the step.
    pub fn svg(&self, title: &str) -> String {
        let (w, h, m) = (800.0, 400.0, 50.0);
        let (pw, ph) = (w - 2.0 * m, h - 2.0 * m);
        let steps = self.loss.len().max(1) as f64;
        let finite: Vec<f64> = self
            .loss
            .iter()
            .map(|&l| f64::from(l))
            .filter(|l| l.is_finite())
            .collect();
        let top = finite.iter().fold(1e-9f64, |a, &b| a.max(b));
        let x = |i: f64| m + pw * i / steps;
        let y = |l: f64| m + ph * (1.0 - (l / top).clamp(0.0, 1.0));
        let ya = |a: f64| m + ph * (1.0 - a.clamp(0.0, 1.0));
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="24" text-anchor="middle" font-size="14">{}</text>"#,
            w / 2.0,
            escape(title)
        );
        let _ = writeln!(
            s,
            r##"<rect x="{m}" y="{m}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##
        );
        let polyline = |s: &mut String, points: &[(f64, f64)], style: &str| {
            let pts: Vec<String> = points
                .iter()
                .map(|(a, b)| format!("{a:.1},{b:.1}"))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" {style} points="{}"/>"#,
                pts.join(" ")
            );
        };
        let raw: Vec<(f64, f64)> = self
            .loss
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (x(i as f64 + 1.0), y(f64::from(l))))
            .collect();
        polyline(&mut s, &raw, r##"stroke="#bbb" stroke-width="1""##);
        let window = (self.loss.len() / 50).max(1);
        let smooth: Vec<(f64, f64)> = (0..self.loss.len())
            .map(|i| {
                let lo = i.saturating_sub(window - 1);
                let part = &self.loss[lo..=i];
                let mean = part.iter().map(|&l| f64::from(l)).sum::<f64>() / part.len() as f64;
                (x(i as f64 + 1.0), y(mean))
            })
            .filter(|(_, v)| v.is_finite())
            .collect();
        polyline(&mut s, &smooth, r##"stroke="#1f5fbf" stroke-width="2""##);
        for (step, acc, _) in &self.test {
            let _ = writeln!(
                s,
                r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="#c0392b"><title>step {step}: test accuracy {acc:.4}</title></circle>"##,
                x(*step as f64),
                ya(*acc)
            );
        }
        for k in 0..=4 {
            let f = f64::from(k) / 4.0;
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{:.1}" text-anchor="end">{:.3}</text>"#,
                m - 6.0,
                y(top * f) + 4.0,
                top * f
            );
            let _ = writeln!(
                s,
                r##"<text x="{}" y="{:.1}" fill="#c0392b">{:.0}%</text>"##,
                w - m + 6.0,
                ya(f) + 4.0,
                f * 100.0
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">step (of {})</text>"#,
            w / 2.0,
            h - 12.0,
            self.loss.len()
        );
        let _ = writeln!(
            s,
            r##"<text x="{m}" y="{}" fill="#1f5fbf">loss</text><text x="{}" y="{}" text-anchor="end" fill="#c0392b">test accuracy</text>"##,
            m - 8.0,
            w - m,
            m - 8.0
        );
        s.push_str("</svg>\n");
        s
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
