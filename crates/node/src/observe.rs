//! What a node tells its operator: Prometheus metrics at `/metrics` (the event log is
//! `tenet_net::events`, shared with the coordinator and the peers).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds (µs) of the latency histogram's buckets.
const BUCKETS_US: [u64; 14] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 1_000_000, 10_000_000,
    60_000_000,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS_US.len()],
    count: u64,
    sum_us: u64,
}

/// Counters and histograms, rendered in Prometheus' text format.
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    latency: Mutex<BTreeMap<&'static str, Histogram>>,
    jobs: Mutex<BTreeMap<&'static str, u64>>,
    /// Pipeline stage jobs by stage number (1-based).
    stage_jobs: Mutex<BTreeMap<u32, u64>>,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
}

impl Metrics {
    /// Count a request to `route` answered with `status` after `us` microseconds.
    pub fn request(&self, route: &'static str, status: u16, us: u64) {
        if let Ok(mut r) = self.requests.lock() {
            *r.entry((route, status)).or_default() += 1;
        }
        if let Ok(mut l) = self.latency.lock() {
            let h = l.entry(route).or_default();
            let i = BUCKETS_US.iter().position(|&b| us <= b);
            if let Some(i) = i {
                h.counts[i] += 1;
            }
            h.count += 1;
            h.sum_us += us;
        }
    }

    /// Count a job ending in `outcome` (`committed`, `failed`, `refused`, ...).
    pub fn job(&self, outcome: &'static str) {
        if let Ok(mut j) = self.jobs.lock() {
            *j.entry(outcome).or_default() += 1;
        }
    }

    /// Count a job that is stage `stage` of a pipeline.
    pub fn stage_job(&self, stage: u32) {
        if let Ok(mut j) = self.stage_jobs.lock() {
            *j.entry(stage).or_default() += 1;
        }
    }

    /// The Prometheus text, with the gauges the caller passes appended.
    pub fn render(&self, gauges: &[(&str, &str, f64)]) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        out.push_str("# HELP tenet_requests_total Requests answered, by route and status.\n");
        out.push_str("# TYPE tenet_requests_total counter\n");
        if let Ok(r) = self.requests.lock() {
            for ((route, status), n) in r.iter() {
                let _ = writeln!(
                    out,
                    "tenet_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP tenet_request_seconds Time to answer a request, by route.\n");
        out.push_str("# TYPE tenet_request_seconds histogram\n");
        if let Ok(l) = self.latency.lock() {
            for (route, h) in l.iter() {
                let mut cumulative = 0;
                for (b, c) in BUCKETS_US.iter().zip(h.counts) {
                    cumulative += c;
                    let le = *b as f64 / 1e6;
                    let _ = writeln!(
                        out,
                        "tenet_request_seconds_bucket{{route=\"{route}\",le=\"{le}\"}} {cumulative}"
                    );
                }
                let _ = writeln!(
                    out,
                    "tenet_request_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {}",
                    h.count
                );
                let _ = writeln!(
                    out,
                    "tenet_request_seconds_sum{{route=\"{route}\"}} {}",
                    h.sum_us as f64 / 1e6
                );
                let _ = writeln!(
                    out,
                    "tenet_request_seconds_count{{route=\"{route}\"}} {}",
                    h.count
                );
            }
        }
        out.push_str("# HELP tenet_jobs_total Jobs by outcome.\n# TYPE tenet_jobs_total counter\n");
        if let Ok(j) = self.jobs.lock() {
            for (outcome, n) in j.iter() {
                let _ = writeln!(out, "tenet_jobs_total{{outcome=\"{outcome}\"}} {n}");
            }
        }
        out.push_str(
            "# HELP tenet_stage_jobs_total Pipeline stage jobs run, by stage.\n# TYPE tenet_stage_jobs_total counter\n",
        );
        if let Ok(j) = self.stage_jobs.lock() {
            for (stage, n) in j.iter() {
                let _ = writeln!(out, "tenet_stage_jobs_total{{stage=\"{stage}\"}} {n}");
            }
        }
        let counters = [
            ("tenet_body_bytes_received_total", &self.bytes_in),
            ("tenet_body_bytes_sent_total", &self.bytes_out),
        ];
        for (name, v) in counters {
            let _ = writeln!(
                out,
                "# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_as_prometheus_text() {
        let m = Metrics::default();
        m.request("job_run", 200, 80);
        m.request("job_run", 200, 3_000);
        m.request("job_run", 401, 20);
        m.job("committed");
        let text = m.render(&[("tenet_store_bytes", "Bytes of blobs stored.", 42.0)]);
        assert!(text.contains("tenet_requests_total{route=\"job_run\",status=\"200\"} 2"));
        assert!(text.contains("tenet_request_seconds_bucket{route=\"job_run\",le=\"0.0001\"} 2"));
        assert!(text.contains("tenet_request_seconds_count{route=\"job_run\"} 3"));
        assert!(text.contains("tenet_jobs_total{outcome=\"committed\"} 1"));
        assert!(text.contains("tenet_store_bytes 42"));
    }
}
