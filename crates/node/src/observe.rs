//! What a node tells its operator: an optional event log (one JSON object per line for every
//! request and every job phase, written by a background thread so requests never wait on the
//! disk) and Prometheus metrics at `/metrics`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

/// Microseconds since the Unix epoch.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Where event lines go, if anywhere.
pub struct EventLog {
    tx: Mutex<Option<mpsc::Sender<String>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl EventLog {
    /// No log.
    pub fn off() -> EventLog {
        EventLog {
            tx: Mutex::new(None),
            writer: Mutex::new(None),
        }
    }

    /// Append lines to `path` (`-` = standard error).
    pub fn open(path: &Path) -> std::io::Result<EventLog> {
        let out: Box<dyn Write + Send> = if path == Path::new("-") {
            Box::new(std::io::stderr())
        } else {
            Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            )
        };
        let (tx, rx) = mpsc::channel::<String>();
        let writer = std::thread::Builder::new()
            .name("tenet-event-log".into())
            .spawn(move || {
                let mut buf = std::io::BufWriter::new(out);
                while let Ok(line) = rx.recv() {
                    let _ = writeln!(buf, "{line}");
                    // Drain what is queued, then flush once: lines reach the file promptly
                    // without a write per line under load.
                    while let Ok(line) = rx.try_recv() {
                        let _ = writeln!(buf, "{line}");
                    }
                    let _ = buf.flush();
                }
            })?;
        Ok(EventLog {
            tx: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
        })
    }

    /// Log one event: `event` names it, `fields` (a JSON object) add to it, with a timestamp.
    pub fn emit(&self, event: &str, fields: serde_json::Value) {
        let Ok(tx) = self.tx.lock() else { return };
        let Some(tx) = tx.as_ref() else { return };
        let mut obj = serde_json::Map::new();
        obj.insert("ts_us".into(), now_us().into());
        obj.insert("event".into(), event.into());
        if let serde_json::Value::Object(f) = fields {
            obj.extend(f);
        }
        let _ = tx.send(serde_json::Value::Object(obj).to_string());
    }

    /// Log a line made elsewhere (already a JSON object with its timestamp).
    pub fn emit_line(&self, line: String) {
        let Ok(tx) = self.tx.lock() else { return };
        if let Some(tx) = tx.as_ref() {
            let _ = tx.send(line);
        }
    }

    pub fn enabled(&self) -> bool {
        self.tx.lock().is_ok_and(|t| t.is_some())
    }

    /// Write out everything logged so far and stop the writer.
    pub fn close(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Some(h) = self.writer.lock().ok().and_then(|mut w| w.take()) {
            let _ = h.join();
        }
    }
}

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

    #[test]
    fn event_lines_are_json_and_all_reach_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let log = EventLog::open(&path).unwrap();
        for i in 0..100 {
            log.emit(
                "job",
                serde_json::json!({"job": format!("j{i}"), "phase": "queued"}),
            );
        }
        log.close();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 100);
        assert_eq!(lines[99]["job"], "j99");
        assert!(lines[0]["ts_us"].as_u64().unwrap() > 0);
    }
}
