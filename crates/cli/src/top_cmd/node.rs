//! `tenet top NODE_URL`: one node's own view — what its public `/v1/info` and `/metrics` say,
//! polled every `--interval`: jobs committed and their rate over the last 10 s, running and
//! queued jobs, busy workers, sessions, the blob store, resident memory, jobs by outcome, and
//! requests by route with their mean latency (sorted by `s`, reversed by `r`).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ratatui::crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table};
use serde_json::Value;
use tenet_net::{Method, NodeClient, RawRequest, identity};

use super::{MAX_FRAME, Tui, next_key, spawn_keys};

async fn get(http: &NodeClient, path: &str) -> Result<Vec<u8>> {
    let r = http
        .send(RawRequest {
            method: Method::GET,
            path: path.into(),
            headers: Vec::new(),
            body: Default::default(),
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if r.status != 200 {
        bail!("GET {path} answered {}", r.status);
    }
    Ok(r.body.to_vec())
}

/// The node's `/v1/info` when `url` is a node's (it names a `node_id`), else `None`.
pub(super) async fn info_if_node(url: &str) -> Option<Value> {
    let http = NodeClient::new(url, identity::generate()).ok()?;
    let info: Value = serde_json::from_slice(&get(&http, "/v1/info").await.ok()?).ok()?;
    info.get("node_id")?.as_str()?;
    Some(info)
}

/// One sample of a node's metrics, by series (`name{labels}`) → value.
type Sample = BTreeMap<String, f64>;

/// Prometheus text to series → value; comments and lines that do not parse are skipped.
fn parse_metrics(text: &str) -> Sample {
    let mut out = Sample::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        if let Some((series, value)) = line.rsplit_once(' ')
            && let Ok(v) = value.trim().parse::<f64>()
        {
            out.insert(series.trim().to_string(), v);
        }
    }
    out
}

/// A label's value in a series name: `route` of `x{route="info",status="200"}`.
fn label<'a>(series: &'a str, name: &str) -> Option<&'a str> {
    let start = series.find(&format!("{name}=\""))? + name.len() + 2;
    let rest = &series[start..];
    Some(&rest[..rest.find('"')?])
}

fn sum(m: &Sample, name: &str, pred: impl Fn(&str) -> bool) -> f64 {
    m.iter()
        .filter(|(s, _)| {
            (s.as_str() == name || s.starts_with(&format!("{name}{{"))) && pred(s.as_str())
        })
        .map(|(_, v)| v)
        // From +0: an empty f64 sum is -0, which prints as "-0".
        .fold(0.0, |a, b| a + b)
}

/// Requests by route: (answered, errors, mean ms).
fn routes(m: &Sample) -> Vec<(String, f64, f64, f64)> {
    let mut by: BTreeMap<String, (f64, f64, f64)> = BTreeMap::new();
    for (s, v) in m {
        if let Some(route) = s
            .strip_prefix("tenet_requests_total{")
            .and_then(|_| label(s, "route"))
        {
            let e = by.entry(route.to_string()).or_default();
            e.0 += v;
            if !label(s, "status").is_some_and(|st| st.starts_with('2')) {
                e.1 += v;
            }
        } else if let Some(route) = s
            .strip_prefix("tenet_request_seconds_sum{")
            .and_then(|_| label(s, "route"))
        {
            by.entry(route.to_string()).or_default().2 = *v;
        }
    }
    by.into_iter()
        .map(|(r, (n, err, secs))| {
            let mean = if n > 0.0 { secs * 1e3 / n } else { 0.0 };
            (r, n, err, mean)
        })
        .collect()
}

fn bytes(n: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut i) = (n.max(0.0), 0);
    while v >= 1024.0 && i < units.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", units[i])
}

/// What the screen and `--once` show.
struct NodeView {
    url: String,
    info: Value,
    metrics: Sample,
    /// (when, jobs committed) over the last 10 s.
    history: VecDeque<(Instant, f64)>,
    error: Option<String>,
    sort: usize,
    reverse: bool,
}

impl NodeView {
    fn committed(&self) -> f64 {
        sum(&self.metrics, "tenet_jobs_total", |s| {
            label(s, "outcome") == Some("committed")
        })
    }

    fn rate(&self) -> f64 {
        match (self.history.front(), self.history.back()) {
            (Some((t0, c0)), Some((t1, c1))) if t1 > t0 => {
                (c1 - c0) / t1.duration_since(*t0).as_secs_f64()
            }
            _ => 0.0,
        }
    }

    fn record(&mut self, info: Value, metrics: Sample) {
        self.info = info;
        self.metrics = metrics;
        let now = Instant::now();
        self.history.push_back((now, self.committed()));
        while self
            .history
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > Duration::from_secs(10))
        {
            self.history.pop_front();
        }
    }

    fn header(&self) -> String {
        let id = self.info["node_id"].as_str().unwrap_or("?");
        format!(
            "tenet top  node {}  {}  {}  {}{}",
            &id[..12.min(id.len())],
            self.url,
            self.info["backend"].as_str().unwrap_or("?"),
            if self.info["open"] == true {
                "open"
            } else {
                "trusted callers"
            },
            self.error
                .as_ref()
                .map_or(String::new(), |e| format!("  UNREACHABLE: {e}"))
        )
    }

    fn figures(&self) -> Vec<(String, String)> {
        let m = &self.metrics;
        let g = |name: &str| sum(m, name, |_| true);
        let failed = sum(m, "tenet_jobs_total", |s| {
            label(s, "outcome") != Some("committed")
        });
        vec![
            ("committed".into(), format!("{}", self.committed())),
            ("jobs/s (10 s)".into(), format!("{:.1}", self.rate())),
            ("failed/refused".into(), format!("{failed}")),
            ("running".into(), format!("{}", g("tenet_jobs_running"))),
            ("queued".into(), format!("{}", g("tenet_queue_waiting"))),
            (
                "workers busy".into(),
                format!("{}", g("tenet_workers_busy")),
            ),
            ("sessions".into(), format!("{}", g("tenet_sessions"))),
            (
                "store".into(),
                format!(
                    "{} in {} blobs",
                    bytes(g("tenet_store_bytes")),
                    g("tenet_store_blobs")
                ),
            ),
            ("resident".into(), bytes(g("tenet_resident_bytes"))),
        ]
    }

    fn sorted_routes(&self) -> Vec<(String, f64, f64, f64)> {
        let mut r = routes(&self.metrics);
        match self.sort {
            0 => r.sort_by(|a, b| b.1.total_cmp(&a.1)),
            1 => r.sort_by(|a, b| b.3.total_cmp(&a.3)),
            _ => r.sort_by(|a, b| a.0.cmp(&b.0)),
        }
        if self.reverse {
            r.reverse();
        }
        r
    }

    fn plain(&self) -> String {
        let mut out = format!("{}\n", self.header());
        for (k, v) in self.figures() {
            out += &format!("{k:<16}{v}\n");
        }
        out += "\nroute            answered  errors  mean\n";
        for (r, n, err, mean) in self.sorted_routes() {
            out += &format!("{r:<16}{n:>9}{err:>8}  {mean:.2} ms\n");
        }
        out
    }

    fn draw(&self, f: &mut ratatui::Frame) {
        let [head, stats, table, foot] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(11),
            Constraint::Min(3),
            Constraint::Length(1),
        ])
        .areas(f.area());
        f.render_widget(
            Paragraph::new(self.header()).style(Style::new().add_modifier(Modifier::BOLD)),
            head,
        );
        let lines: Vec<Line> = self
            .figures()
            .into_iter()
            .map(|(k, v)| Line::from(format!("{k:<16}{v}")))
            .collect();
        f.render_widget(
            Paragraph::new(lines).block(Block::new().borders(Borders::ALL).title(" jobs ")),
            stats,
        );
        let rows = self.sorted_routes().into_iter().map(|(r, n, err, mean)| {
            Row::new(vec![
                r,
                format!("{n}"),
                format!("{err}"),
                format!("{mean:.2} ms"),
            ])
        });
        let by = ["answered", "mean latency", "route"][self.sort % 3];
        f.render_widget(
            Table::new(
                rows,
                [
                    Constraint::Length(18),
                    Constraint::Length(10),
                    Constraint::Length(8),
                    Constraint::Length(12),
                ],
            )
            .header(
                Row::new(vec!["route", "answered", "errors", "mean"])
                    .style(Style::new().add_modifier(Modifier::BOLD)),
            )
            .block(
                Block::new()
                    .borders(Borders::ALL)
                    .title(format!(" requests by route (by {by}) ")),
            ),
            table,
        );
        f.render_widget(
            Paragraph::new("q quit · s sort (answered, latency, route) · r reverse"),
            foot,
        );
    }
}

async fn poll(http: &NodeClient) -> Result<(Value, Sample)> {
    let info: Value = serde_json::from_slice(&get(http, "/v1/info").await?)
        .context("the node's /v1/info is not JSON")?;
    let text = String::from_utf8_lossy(&get(http, "/metrics").await?).into_owned();
    Ok((info, parse_metrics(&text)))
}

/// Watch the node at `url` (its `info` already read).
pub(super) fn run(
    rt: &tokio::runtime::Runtime,
    url: &str,
    info: Value,
    once: bool,
    interval: Duration,
) -> Result<()> {
    let http = NodeClient::new(url, identity::generate()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut v = NodeView {
        url: url.to_string(),
        info,
        metrics: Sample::new(),
        history: VecDeque::new(),
        error: None,
        sort: 0,
        reverse: false,
    };
    let (info, metrics) = rt.block_on(poll(&http))?;
    v.record(info, metrics);
    if once {
        print!("{}", v.plain());
        return Ok(());
    }
    let mut term = Tui::enter()?;
    let keys = spawn_keys()?;
    let mut last_poll = Instant::now();
    let mut last_draw: Option<Instant> = None;
    let mut asked = true;
    loop {
        if last_poll.elapsed() >= interval {
            match rt.block_on(poll(&http)) {
                Ok((info, metrics)) => {
                    v.record(info, metrics);
                    v.error = None;
                }
                Err(e) => v.error = Some(format!("{e:#}")),
            }
            last_poll = Instant::now();
            asked = true;
        }
        if asked || last_draw.is_none_or(|t| t.elapsed() >= MAX_FRAME) {
            term.terminal.draw(|f| v.draw(f)).context("drawing")?;
            last_draw = Some(Instant::now());
            asked = false;
        }
        let Some(ev) = next_key(&keys)? else {
            continue;
        };
        match ev {
            Event::Key(k) if k.kind != KeyEventKind::Release => {
                let ctrl = k.modifiers.contains(KeyModifiers::CONTROL);
                match k.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') | KeyCode::Char('d') if ctrl => return Ok(()),
                    KeyCode::Char('s') => v.sort = (v.sort + 1) % 3,
                    KeyCode::Char('r') => v.reverse = !v.reverse,
                    _ => {}
                }
                asked = true;
            }
            Event::Resize(..) => asked = true,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_text_is_read_into_figures_and_routes() {
        let text = "# HELP x\n# TYPE tenet_jobs_total counter\n\
            tenet_jobs_total{outcome=\"committed\"} 7\n\
            tenet_jobs_total{outcome=\"refused\"} 2\n\
            tenet_requests_total{route=\"job_run\",status=\"200\"} 9\n\
            tenet_requests_total{route=\"job_run\",status=\"503\"} 2\n\
            tenet_request_seconds_sum{route=\"job_run\"} 0.022\n\
            tenet_jobs_running 1\nnot a metric line\n";
        let m = parse_metrics(text);
        let mut v = NodeView {
            url: "http://n".into(),
            info: serde_json::json!({"node_id": "ab".repeat(32), "backend": "cpu", "open": false}),
            metrics: Sample::new(),
            history: VecDeque::new(),
            error: None,
            sort: 0,
            reverse: false,
        };
        v.record(v.info.clone(), m);
        assert_eq!(v.committed(), 7.0);
        assert_eq!(
            format!("{}", sum(&Sample::new(), "tenet_jobs_total", |_| true)),
            "0"
        );
        let r = routes(&v.metrics);
        assert_eq!(r, vec![("job_run".to_string(), 11.0, 2.0, 2.0)]);
        let text = v.plain();
        assert!(text.contains("node abababababab"), "{text}");
        assert!(text.contains("failed/refused  2"), "{text}");
        assert!(text.contains("running         1"), "{text}");
        assert!(text.contains("job_run"), "{text}");
    }
}
