//! Drawing `tenet top`: the screen (ratatui), and the same facts as plain text for `--once`.
//!
//! ```text
//! tenet top  coordinator d6e30072982f  http://127.0.0.1:7080  ● live  up 10m18s  v0.1.0  3 replicas
//! ┌ jobs (decided/s over 10 s) ───────────────┐┌ decided per second, last 60 s (peak 3) ───┐
//! │ decided/s      0.3     in flight        0 ││                              ▂▃▅▇█▇▅▃▂▁ █ │
//! │ queue            0     decided         11 ││                                         █ │
//! │ failed           0     slashed         11 ││                                         █ │
//! └───────────────────────────────────────────┘└───────────────────────────────────────────┘
//! ┌ nodes 3/3 · sort stake ↓ ─────────────────────────────────────────────────────────────┐
//! │  ID           STATE    STAKE  SCORE  AGREED/DIS IN-FLIGHT DEVICE HEARTBEAT            │
//! │▶ bea9f76c221f active    1011  1.000        11/0         0 cpu      1s ago             │
//! │  4d13301984b4 active     316  0.000        0/11         0 cpu      1s ago SLASHED ×11 │
//! └ bea9f76c221f19eaac7fb0469604cfbac2d0ebdc6aa18f963d20875431bdb399  http://127.0.0.1:33535 ┘
//! ┌ latest slashes ──────────────┐┌ recent jobs (11 known) ────────────────────────────────┐
//! │   AGO NODE      AMOUNT JOB   ││JOB          TASK         STATE    AGREE  MS FLAGS      │
//! q quit  s sort  r reverse  / filter  p pause  ↑↓ select
//! ```

use std::fmt::Write as _;

use ratatui::Frame;
use ratatui::layout::{Alignment, Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Block, Cell, Paragraph, RenderDirection, Row, Sparkline, Table, TableState,
};

use super::feed::Conn;
use super::state::{Job, JobState, Model, NodeRow, SortKey, ViewState, short};

/// What one frame shows.
pub struct Screen<'a> {
    pub model: &'a Model,
    pub view: &'a ViewState,
    pub conn: &'a Conn,
    pub note: Option<&'a str>,
    pub url: &'a str,
    /// Now, on the coordinator's clock as [`Model::now`] tells it (µs).
    pub now_us: u64,
}

/// `s` as a short age: `7s`, `4m05s`, `2h03m`, `3d04h`.
pub fn age(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        3600..86400 => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d{:02}h", secs / 86400, secs % 86400 / 3600),
    }
}

fn ago_us(now_us: u64, ts_us: u64) -> String {
    age(now_us.saturating_sub(ts_us) / 1_000_000)
}

fn heartbeat(now_us: u64, unix_s: u64) -> String {
    if unix_s == 0 {
        "never".into()
    } else {
        format!("{} ago", age((now_us / 1_000_000).saturating_sub(unix_s)))
    }
}

fn count(n: u64, partial: bool) -> String {
    if partial {
        format!("{n}+")
    } else {
        n.to_string()
    }
}

fn sort_label(v: &ViewState) -> String {
    // The natural order: largest first, except ids A to Z.
    let descending = (v.sort != SortKey::Id) != v.reverse;
    format!(
        "sort {} {}",
        v.sort.name(),
        if descending { "↓" } else { "↑" }
    )
}

fn conn_style(c: &Conn) -> Style {
    match c {
        Conn::Live => Style::new().fg(Color::Green).bold(),
        Conn::Connecting => Style::new().fg(Color::Gray),
        Conn::Reconnecting(_) | Conn::Polling(_) => Style::new().fg(Color::Yellow).bold(),
    }
}

/// Why the feed is not live, in a line.
fn conn_note(c: &Conn) -> Option<String> {
    match c {
        Conn::Polling(why) => Some(format!("{why}; polling jobs every second")),
        Conn::Reconnecting(why) => Some(format!("{why}; reconnecting")),
        _ => None,
    }
}

fn agreement(j: &Job) -> String {
    match (j.agreeing, j.replicas) {
        (Some(k), Some(n)) => format!("{k}/{n}"),
        (Some(k), None) => format!("{k}/?"),
        (None, Some(n)) => format!("-/{n}"),
        _ => "-".into(),
    }
}

fn flags(j: &Job) -> String {
    let mut f = Vec::new();
    if j.disputed {
        f.push("dispute".to_string());
    }
    if j.refereed {
        f.push("refereed".to_string());
    }
    if j.dissenting > 0 {
        f.push(format!("{} outvoted", j.dissenting));
    }
    if let Some(e) = &j.error {
        f.push(e.clone());
    }
    f.join(" ")
}

fn state_style(s: JobState) -> Style {
    match s {
        JobState::Decided => Style::new().fg(Color::Green),
        JobState::Failed => Style::new().fg(Color::Red),
        _ => Style::new().fg(Color::Yellow),
    }
}

/// Draw one frame.
pub fn draw(f: &mut Frame<'_>, s: &Screen<'_>) {
    let area = f.area();
    // The nodes table as tall as its rows (the lists below take the rest), leaving the lists
    // at least a few rows.
    let avail = area.height.saturating_sub(7);
    let shown = s.model.rows(s.view).len().min(u16::MAX as usize) as u16;
    let nodes_h = shown
        .saturating_add(3)
        .clamp(5, avail.saturating_sub(8).max(5));
    let [header, stats, nodes, lists, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(5),
        Constraint::Length(nodes_h),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(area);
    draw_header(f, header, s);
    draw_stats(f, stats, s);
    draw_nodes(f, nodes, s);
    let [slashes, jobs] =
        Layout::horizontal([Constraint::Percentage(40), Constraint::Percentage(60)]).areas(lists);
    draw_slashes(f, slashes, s);
    draw_jobs(f, jobs, s);
    draw_footer(f, footer, s);
}

fn draw_header(f: &mut Frame<'_>, area: Rect, s: &Screen<'_>) {
    let m = s.model;
    let mut spans = vec![
        Span::styled("tenet top", Style::new().bold()),
        Span::raw("  "),
    ];
    if let Some(i) = &m.info {
        spans.push(Span::raw("coordinator "));
        spans.push(Span::styled(
            short(&i.coordinator).to_string(),
            Style::new().cyan(),
        ));
        spans.push(Span::raw("  "));
    }
    spans.push(Span::raw(s.url.to_string()));
    spans.push(Span::raw("  "));
    spans.push(Span::styled(
        format!("● {}", s.conn.label()),
        conn_style(s.conn),
    ));
    spans.push(Span::raw("  "));
    spans.push(Span::raw(match m.started_us {
        Some(t) => format!("up {}", ago_us(s.now_us, t)),
        None => "up ?".into(),
    }));
    if let Some(i) = &m.info {
        spans.push(Span::raw(format!(
            "  v{}  {} replicas{}",
            i.version,
            i.replicas,
            if i.open { "  open" } else { "" }
        )));
    }
    if m.shutdown {
        spans.push(Span::raw("  "));
        spans.push(Span::styled(
            " SHUT DOWN ",
            Style::new().fg(Color::Black).bg(Color::Red),
        ));
    }
    if s.view.paused {
        spans.push(Span::raw("  "));
        spans.push(Span::styled(" PAUSED ", Style::new().reversed()));
    }
    f.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn draw_stats(f: &mut Frame<'_>, area: Rect, s: &Screen<'_>) {
    let m = s.model;
    let [left, right] =
        Layout::horizontal([Constraint::Length(52), Constraint::Min(10)]).areas(area);
    let label = Style::new().fg(Color::Gray);
    let value = Style::new().bold();
    let pair = |name: &str, v: String, width: usize| -> Vec<Span<'static>> {
        vec![
            Span::styled(format!(" {name:<10}"), label),
            Span::styled(format!("{v:>8}"), value),
            Span::raw(" ".repeat(width)),
        ]
    };
    let slashed = m.slashed_total();
    let mut third = pair("failed", count(m.failed_total, m.totals_partial), 4);
    third.extend(vec![
        Span::styled(format!(" {:<10}", "slashed"), label),
        Span::styled(
            format!("{slashed:>8}"),
            if slashed > 0 {
                Style::new().bold().fg(Color::Red)
            } else {
                value
            },
        ),
    ]);
    let lines = vec![
        Line::from(
            [
                pair("decided/s", format!("{:.1}", m.throughput(s.now_us)), 4),
                pair("in flight", m.in_flight().to_string(), 0),
            ]
            .concat(),
        ),
        Line::from(
            [
                pair("queue", m.queue().to_string(), 4),
                pair("decided", count(m.decided_total, m.totals_partial), 0),
            ]
            .concat(),
        ),
        Line::from(third),
    ];
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" jobs (decided/s over 10 s) ")),
        left,
    );
    let history = m.history(s.now_us);
    let peak = history.iter().copied().max().unwrap_or(0);
    let block = Block::bordered().title(format!(
        " decided per second, last {} s (peak {peak}) ",
        history.len()
    ));
    let inner = block.inner(right);
    f.render_widget(block, right);
    let width = inner.width as usize;
    f.render_widget(
        Sparkline::default()
            .data(history.iter().take(width).copied())
            .direction(RenderDirection::RightToLeft)
            .max(peak.max(1))
            .style(Style::new().fg(Color::Green)),
        inner,
    );
}

fn node_cells(r: &NodeRow<'_>, now_us: u64) -> Vec<Cell<'static>> {
    let n = r.node;
    let right = |t: String| Cell::from(Line::from(t).alignment(Alignment::Right));
    let state_style = match n.state.as_str() {
        "active" => Style::new().fg(Color::Green),
        "unhealthy" => Style::new().fg(Color::Yellow),
        _ => Style::new().fg(Color::Gray),
    };
    let slashed = match r.slashed {
        0 => Cell::from(""),
        1 => Cell::from(Span::styled("SLASHED", Style::new().fg(Color::Red).bold())),
        k => Cell::from(Span::styled(
            format!("SLASHED ×{k}"),
            Style::new().fg(Color::Red).bold(),
        )),
    };
    vec![
        Cell::from(short(&n.id).to_string()),
        Cell::from(Span::styled(n.state.clone(), state_style)),
        right(n.stake.to_string()),
        right(format!("{:.3}", n.score)),
        right(format!("{}/{}", n.agreed, n.disagreed)),
        right(r.in_flight.to_string()),
        Cell::from(n.device.clone()),
        right(heartbeat(now_us, n.last_heartbeat)),
        slashed,
    ]
}

const NODE_HEADER: [&str; 9] = [
    "ID",
    "STATE",
    "STAKE",
    "SCORE",
    "AGREED/DIS",
    "IN-FLIGHT",
    "DEVICE",
    "HEARTBEAT",
    "",
];

fn draw_nodes(f: &mut Frame<'_>, area: Rect, s: &Screen<'_>) {
    let rows = s.model.rows(s.view);
    let mut title = format!(
        " nodes {}/{} · {} ",
        rows.len(),
        s.model.nodes.len(),
        sort_label(s.view)
    );
    if !s.view.filter.is_empty() {
        let _ = write!(title, "· filter \"{}\" ", s.view.filter);
    }
    let selected = s.view.selected_index(&rows);
    let mut block = Block::bordered().title(title);
    if let Some(r) = selected.map(|i| &rows[i]) {
        let n = r.node;
        let mut about = format!(" {}  {} ", n.id, n.url);
        // A node without an operator answers for itself (the operator is then its id).
        if !n.operator.is_empty() && n.operator != n.id {
            let op: String = n.operator.chars().take(32).collect();
            let _ = write!(about, " operator {op} ");
        }
        block = block.title_bottom(about);
    }
    let header = Row::new(
        NODE_HEADER
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let l = Line::from(*h);
                // The numeric columns' headers sit over their right-aligned values.
                Cell::from(if (2..=5).contains(&i) || i == 7 {
                    l.alignment(Alignment::Right)
                } else {
                    l
                })
            })
            .collect::<Vec<_>>(),
    )
    .style(Style::new().bold().fg(Color::Gray));
    let body: Vec<Row<'static>> = rows
        .iter()
        .map(|r| {
            let row = Row::new(node_cells(r, s.now_us));
            if r.slashed > 0 {
                row.style(Style::new().fg(Color::Red))
            } else {
                row
            }
        })
        .collect();
    let empty = body.is_empty();
    let device_w = rows
        .iter()
        .map(|r| r.node.device.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(6, 28) as u16;
    let table = Table::new(
        body,
        [
            Constraint::Length(12),
            Constraint::Length(12),
            Constraint::Length(10),
            Constraint::Length(6),
            Constraint::Length(11),
            Constraint::Length(9),
            Constraint::Length(device_w),
            Constraint::Length(10),
            Constraint::Min(11),
        ],
    )
    .header(header)
    .block(block)
    .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
    .highlight_symbol("▶ ");
    let mut state = TableState::default().with_selected(selected);
    f.render_stateful_widget(table, area, &mut state);
    if empty && area.height > 3 {
        let msg = if s.model.nodes.is_empty() {
            "no nodes registered"
        } else {
            "no node matches the filter"
        };
        let inner = Rect {
            y: area.y + 2,
            height: 1,
            ..area.inner(ratatui::layout::Margin::new(1, 0))
        };
        f.render_widget(Paragraph::new(msg).fg(Color::Gray), inner);
    }
}

fn draw_slashes(f: &mut Frame<'_>, area: Rect, s: &Screen<'_>) {
    let rows: Vec<Row<'static>> = s
        .model
        .slashes
        .iter()
        .map(|x| {
            Row::new(vec![
                Cell::from(Line::from(ago_us(s.now_us, x.ts_us)).alignment(Alignment::Right)),
                Cell::from(short(&x.node).to_string()).fg(Color::Red),
                Cell::from(Line::from(format!("-{}", x.amount)).alignment(Alignment::Right)),
                Cell::from(short(&x.job).to_string()),
            ])
        })
        .collect();
    let table = Table::new(
        rows,
        [
            Constraint::Length(6),
            Constraint::Length(12),
            Constraint::Length(8),
            Constraint::Length(12),
        ],
    )
    .header(
        Row::new(vec![
            Cell::from(Line::from("AGO").alignment(Alignment::Right)),
            Cell::from("NODE"),
            Cell::from(Line::from("AMOUNT").alignment(Alignment::Right)),
            Cell::from("JOB"),
        ])
        .style(Style::new().bold().fg(Color::Gray)),
    )
    .block(Block::bordered().title(" latest slashes "));
    f.render_widget(table, area);
}

fn draw_jobs(f: &mut Frame<'_>, area: Rect, s: &Screen<'_>) {
    let n = area.height.saturating_sub(3) as usize;
    let rows: Vec<Row<'static>> = s
        .model
        .recent_jobs(n)
        .into_iter()
        .map(|j| {
            Row::new(vec![
                Cell::from(short(&j.id).to_string()),
                Cell::from(j.task.as_deref().map_or("-", short).to_string()),
                Cell::from(Span::styled(j.state.as_str(), state_style(j.state))),
                Cell::from(Line::from(agreement(j)).alignment(Alignment::Right)),
                Cell::from(
                    Line::from(j.ms.map_or("-".into(), |ms| format!("{ms:.0}")))
                        .alignment(Alignment::Right),
                ),
                Cell::from(flags(j)),
            ])
        })
        .collect();
    let table = Table::new(
        rows,
        [
            Constraint::Length(12),
            Constraint::Length(12),
            Constraint::Length(10),
            Constraint::Length(5),
            Constraint::Length(7),
            Constraint::Min(10),
        ],
    )
    .header(
        Row::new(vec![
            Cell::from("JOB"),
            Cell::from("TASK"),
            Cell::from("STATE"),
            Cell::from(Line::from("AGREE").alignment(Alignment::Right)),
            Cell::from(Line::from("MS").alignment(Alignment::Right)),
            Cell::from("FLAGS"),
        ])
        .style(Style::new().bold().fg(Color::Gray)),
    )
    .block(Block::bordered().title(format!(" recent jobs ({} known) ", s.model.jobs_known())));
    f.render_widget(table, area);
}

fn draw_footer(f: &mut Frame<'_>, area: Rect, s: &Screen<'_>) {
    let key = Style::new().bold().fg(Color::Cyan);
    let line = if s.view.editing {
        Line::from(vec![
            Span::styled("filter: ", key),
            Span::raw(s.view.filter.clone()),
            Span::styled("█", Style::new().fg(Color::Gray)),
            Span::styled(
                "   Enter keeps it · Esc clears it",
                Style::new().fg(Color::Gray),
            ),
        ])
    } else {
        let mut spans = Vec::new();
        for (k, what) in [
            ("q", "quit"),
            ("s", "sort"),
            ("r", "reverse"),
            ("/", "filter"),
            ("p", if s.view.paused { "resume" } else { "pause" }),
            ("↑↓", "select"),
        ] {
            spans.push(Span::styled(k, key));
            spans.push(Span::raw(format!(" {what}  ")));
        }
        let note = s.note.map(str::to_string).or_else(|| conn_note(s.conn));
        if let Some(n) = note {
            spans.push(Span::styled(n, Style::new().fg(Color::Yellow)));
        }
        Line::from(spans)
    };
    f.render_widget(Paragraph::new(line), area);
}

/// The snapshot `--once` prints: the same facts as the screen, as plain text.
pub fn plain(s: &Screen<'_>) -> String {
    let m = s.model;
    let mut o = String::new();
    match &m.info {
        Some(i) => {
            let _ = writeln!(
                o,
                "tenet top: coordinator {} at {} (v{}, {} replicas{}), events {}{}",
                i.coordinator,
                s.url,
                i.version,
                i.replicas,
                if i.open { ", open" } else { "" },
                s.conn.label(),
                match m.started_us {
                    Some(t) => format!(", up {}", ago_us(s.now_us, t)),
                    None => String::new(),
                }
            );
        }
        None => {
            let _ = writeln!(o, "tenet top: {}", s.url);
        }
    }
    if let Some(n) = conn_note(s.conn) {
        let _ = writeln!(o, "  ({n})");
    }
    let _ = writeln!(
        o,
        "jobs: decided {}, failed {}, in flight {}, queue {}, slashed {}, decided/s {:.1} over the last 10 s",
        count(m.decided_total, m.totals_partial),
        count(m.failed_total, m.totals_partial),
        m.in_flight(),
        m.queue(),
        m.slashed_total(),
        m.throughput(s.now_us),
    );
    let rows = m.rows(s.view);
    let _ = writeln!(o, "\nnodes ({}):", rows.len());
    let _ = writeln!(
        o,
        "  {:<12}  {:<12}  {:>10}  {:>6}  {:>10}  {:>9}  {:<12}  {:>10}",
        "ID", "STATE", "STAKE", "SCORE", "AGREED/DIS", "IN-FLIGHT", "DEVICE", "HEARTBEAT"
    );
    for r in &rows {
        let n = r.node;
        let _ = writeln!(
            o,
            "  {:<12}  {:<12}  {:>10}  {:>6.3}  {:>10}  {:>9}  {:<12}  {:>10}{}",
            short(&n.id),
            n.state,
            n.stake,
            n.score,
            format!("{}/{}", n.agreed, n.disagreed),
            r.in_flight,
            n.device,
            heartbeat(s.now_us, n.last_heartbeat),
            match r.slashed {
                0 => String::new(),
                1 => "  SLASHED".into(),
                k => format!("  SLASHED ×{k}"),
            }
        );
    }
    if !m.slashes.is_empty() {
        let _ = writeln!(o, "\nlatest slashes:");
        for x in m.slashes.iter().take(10) {
            let _ = writeln!(
                o,
                "  {:>6} ago  node {}  -{}  job {}",
                ago_us(s.now_us, x.ts_us),
                short(&x.node),
                x.amount,
                short(&x.job)
            );
        }
    }
    let recent = m.recent_jobs(10);
    if !recent.is_empty() {
        let _ = writeln!(o, "\nrecent jobs:");
        for j in recent {
            let line = format!(
                "  {:<12}  {:<12}  {:<10}  {:>5}  {:>7}  {}",
                short(&j.id),
                j.task.as_deref().map_or("-", short),
                j.state.as_str(),
                agreement(j),
                j.ms.map_or("-".into(), |ms| format!("{ms:.0} ms")),
                flags(j)
            );
            let _ = writeln!(o, "{}", line.trim_end());
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;
    use serde_json::json;

    use super::*;

    const S: u64 = 1_000_000;

    fn model() -> Model {
        let mut m = Model::default();
        m.set_info(&json!({"coordinator": "c0ffee".repeat(10), "version": "0.1.0", "replicas": 3, "open": true}));
        let node = |id: &str, stake: i64, dis: i64| {
            json!({"id": id.repeat(64 / id.len()), "url": "http://127.0.0.1:7070", "stake": stake,
                "state": "active", "operator": "", "device": "cpu", "agreed": 9, "disagreed": dis,
                "score": 0.9, "last_heartbeat": 95})
        };
        m.set_nodes(&json!([
            node("a1", 1000, 0),
            node("b2", 900, 1),
            node("c3", 800, 0)
        ]));
        for (i, t) in [90 * S, 95 * S, 99 * S].into_iter().enumerate() {
            let id = format!("{i}").repeat(64);
            m.apply_json(
                &json!({"ts_us": t, "event": "job", "job": id, "phase": "accepted", "replicas": 3}),
            );
            m.apply_json(&json!({"ts_us": t, "event": "job", "job": id, "phase": "assigned", "node": "a1".repeat(32)}));
            if i < 2 {
                m.apply_json(&json!({"ts_us": t + 5000, "event": "job", "job": id, "phase": "decided",
                    "agreeing": ["x", "y"], "dissenting": ["b2".repeat(32)], "replicas": 3, "ms": 41.7, "disputed": false}));
                m.apply_json(&json!({"ts_us": t + 5000, "event": "slashed", "job": id, "node": "b2".repeat(32), "amount": 100}));
            }
        }
        m.apply_json(&json!({"ts_us": 40 * S, "event": "start"}));
        m
    }

    fn text(t: &Terminal<TestBackend>) -> String {
        let b = t.backend().buffer();
        let mut s = String::new();
        for y in 0..b.area.height {
            for x in 0..b.area.width {
                s.push_str(b[(x, y)].symbol());
            }
            s.push('\n');
        }
        s
    }

    fn render(w: u16, h: u16, view: &ViewState, conn: &Conn) -> String {
        let m = model();
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| {
            draw(
                f,
                &Screen {
                    model: &m,
                    view,
                    conn,
                    note: None,
                    url: "http://127.0.0.1:7080",
                    now_us: 100 * S,
                },
            )
        })
        .unwrap();
        text(&t)
    }

    #[test]
    fn the_screen_shows_every_part_at_120_by_35() {
        let screen = render(120, 35, &ViewState::default(), &Conn::Live);
        for want in [
            "tenet top",
            "coordinator c0ffeec0ffee",
            "● live",
            "up 1m00s",
            "a1a1a1a1a1a1",
            "b2b2b2b2b2b2",
            "c3c3c3c3c3c3",
            "SLASHED ×2",
            "latest slashes",
            "recent jobs",
            "2/3",
            "1 outvoted",
            "q quit",
            "sort stake ↓",
            "decided/s",
        ] {
            assert!(screen.contains(want), "{want:?} missing from\n{screen}");
        }
        // The slashed node's row says so; the others do not.
        let row = |id: &str| screen.lines().find(|l| l.contains(id)).unwrap().to_string();
        assert!(row("b2b2b2b2b2b2 ").contains("SLASHED"));
        assert!(!row("a1a1a1a1a1a1 ").contains("SLASHED"));
        // a1 has one job in flight, the others none.
        assert!(
            row("a1a1a1a1a1a1 ").contains(" 1 "),
            "{}",
            row("a1a1a1a1a1a1 ")
        );
        // Totals: 2 decided, 1 in flight.
        assert!(screen.contains("decided          2"), "{screen}");
    }

    #[test]
    fn filtering_editing_pausing_and_polling_show() {
        let view = ViewState {
            filter: "c3".into(),
            editing: true,
            paused: true,
            ..ViewState::default()
        };
        let screen = render(
            160,
            45,
            &view,
            &Conn::Polling("event stream: refused".into()),
        );
        assert!(screen.contains("c3c3c3c3c3c3"));
        assert!(!screen.contains("a1a1a1a1a1a1 "), "{screen}");
        assert!(screen.contains("filter: c3"));
        assert!(screen.contains("PAUSED"));
        assert!(screen.contains("● polling"));
        let plain_view = ViewState::default();
        let screen = render(
            160,
            45,
            &plain_view,
            &Conn::Polling("event stream: refused".into()),
        );
        assert!(screen.contains("polling jobs every second"), "{screen}");
    }

    #[test]
    fn tiny_terminals_do_not_break_the_drawing() {
        for (w, h) in [(1, 1), (20, 5), (40, 10), (80, 24)] {
            render(w, h, &ViewState::default(), &Conn::Connecting);
        }
    }

    #[test]
    fn the_plain_snapshot_says_the_same() {
        let m = model();
        let out = plain(&Screen {
            model: &m,
            view: &ViewState::default(),
            conn: &Conn::Live,
            note: None,
            url: "http://h:1",
            now_us: 100 * S,
        });
        assert!(out.contains("decided 2, failed 0, in flight 1"), "{out}");
        assert!(out.contains("slashed 2"), "{out}");
        let b2 = out.lines().find(|l| l.contains("b2b2b2b2b2b2")).unwrap();
        assert!(b2.ends_with("SLASHED ×2"), "{b2}");
        assert!(out.contains("latest slashes:"));
        assert_eq!(out.matches("node b2b2b2b2b2b2").count(), 2);
    }

    #[test]
    fn ages() {
        assert_eq!(age(7), "7s");
        assert_eq!(age(245), "4m05s");
        assert_eq!(age(7380), "2h03m");
        assert_eq!(age(3 * 86400 + 4 * 3600), "3d04h");
    }
}
