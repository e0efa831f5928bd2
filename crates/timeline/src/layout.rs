//! Where everything goes: a [`Timeline`] becomes a [`Scene`], a list of rectangles, frames and
//! text runs in pixel coordinates, which both renderers draw as given (the SVG as elements, the
//! PNG by filling pixels). Pure geometry: no I/O, and the same timeline and style always give
//! the same scene.
//!
//! From the top: the title, a summary line, the legend, the time axis's labels, then one band
//! per lane (its label on the left, bars in rows, marks), then notes. Text is measured in the
//! bitmap font's cells (see `font`), which the SVG's monospace text is sized to match.

use crate::font;
use crate::model::{BarKind, LaneKind, MarkKind, Timeline};

/// The picture's width in pixels when none is asked for.
pub const DEFAULT_WIDTH: u32 = 1600;
/// Narrowest and widest pictures drawn; widths outside are clamped.
pub const MIN_WIDTH: u32 = 640;
pub const MAX_WIDTH: u32 = 8192;

/// How to draw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Style {
    /// Width in pixels (clamped to [`MIN_WIDTH`]..=[`MAX_WIDTH`]); the height follows from the
    /// lanes.
    pub width: u32,
    /// The title line [default: "tenet timeline"].
    pub title: Option<String>,
}

impl Default for Style {
    fn default() -> Style {
        Style {
            width: DEFAULT_WIDTH,
            title: None,
        }
    }
}

/// A colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rgb(pub u8, pub u8, pub u8);

impl Rgb {
    /// `#rrggbb`.
    pub fn hex(self) -> String {
        format!("#{:02x}{:02x}{:02x}", self.0, self.1, self.2)
    }
}

/// The palette, shared by both renderers and by tests that look for colours in pixels.
pub mod palette {
    use super::Rgb;
    pub const BACKGROUND: Rgb = Rgb(255, 255, 255);
    pub const LANE_ALT: Rgb = Rgb(243, 245, 248);
    pub const GRID: Rgb = Rgb(224, 228, 234);
    pub const RULE: Rgb = Rgb(150, 156, 165);
    pub const TEXT: Rgb = Rgb(33, 37, 41);
    pub const MUTED: Rgb = Rgb(100, 108, 118);
    pub const ON_DARK: Rgb = Rgb(255, 255, 255);
    /// Disagreement and slashing: red, and used for nothing else.
    pub const ALARM: Rgb = Rgb(214, 30, 30);
    pub const MEMBERSHIP: Rgb = Rgb(140, 140, 140);
    pub const QUEUED: Rgb = Rgb(178, 192, 212);
    pub const COMPUTING: Rgb = Rgb(45, 105, 185);
    pub const REVEALING: Rgb = Rgb(40, 160, 100);
    pub const AWAITING: Rgb = Rgb(125, 178, 232);
    pub const JOB: Rgb = Rgb(130, 105, 190);
    pub const FAILED: Rgb = Rgb(240, 150, 30);
}

/// The fill of a bar of `kind`.
pub fn bar_colour(kind: BarKind) -> Rgb {
    match kind {
        BarKind::Queued => palette::QUEUED,
        BarKind::Computing => palette::COMPUTING,
        BarKind::Revealing => palette::REVEALING,
        BarKind::Awaiting => palette::AWAITING,
        BarKind::Job => palette::JOB,
        BarKind::Failed => palette::FAILED,
    }
}

/// Where a text run's `x` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anchor {
    Start,
    Middle,
    End,
}

/// One thing to draw. Later shapes cover earlier ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// A filled rectangle; `tip` is the SVG's tooltip.
    Rect {
        x: i32,
        y: i32,
        w: u32,
        h: u32,
        fill: Rgb,
        tip: Option<String>,
    },
    /// A rectangle's outline, `thickness` pixels wide, inside its bounds.
    Frame {
        x: i32,
        y: i32,
        w: u32,
        h: u32,
        colour: Rgb,
        thickness: u32,
    },
    /// Text in the bitmap font's cells at `scale`: `y` is the top of the cell, `x` where
    /// `anchor` says.
    Text {
        x: i32,
        y: i32,
        scale: u32,
        colour: Rgb,
        anchor: Anchor,
        text: String,
        tip: Option<String>,
    },
}

/// A lane's band, top to bottom.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Band {
    pub top: u32,
    pub height: u32,
}

/// A whole picture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scene {
    pub width: u32,
    pub height: u32,
    pub background: Rgb,
    pub shapes: Vec<Shape>,
    /// Each lane's band, in the timeline's lane order.
    pub bands: Vec<Band>,
    /// The time axis: x of `start_us` and of `end_us`.
    pub plot: (i32, i32),
}

const MARGIN: u32 = 16;
/// Scale of most text (12 × 16-pixel cells); the title is drawn larger.
const TEXT: u32 = 2;
const TITLE: u32 = 3;
/// The label column: a node label (12 characters) and a space.
const LABEL_W: u32 = 13 * font::ADVANCE * TEXT + 8;
const BAR_H: u32 = 16;
const ROW_PITCH: u32 = 22;
const LANE_PAD: u32 = 6;
const LANE_MIN_H: u32 = 28;
/// Job ids shown inside bars wide enough, in this many characters at scale 1.
const BAR_LABEL_CHARS: usize = 8;

/// Width in pixels of `text` at `scale`.
pub fn text_width(text: &str, scale: u32) -> u32 {
    let n = u32::try_from(text.chars().count()).unwrap_or(u32::MAX);
    n.saturating_mul(font::ADVANCE * scale)
        .saturating_sub(scale)
}

/// Height in pixels of a line of text at `scale`.
pub fn text_height(scale: u32) -> u32 {
    font::GLYPH_H * scale
}

/// Lay `t` out.
pub fn layout(t: &Timeline, style: &Style) -> Scene {
    let width = style.width.clamp(MIN_WIDTH, MAX_WIDTH);
    let mut s = Vec::new();
    let fit = |text: &str, scale: u32| -> String {
        let room = (width - 2 * MARGIN) / (font::ADVANCE * scale);
        crate::events::cut(text, room as usize).to_string()
    };
    let mut y = MARGIN;
    let title = style.title.as_deref().unwrap_or("tenet timeline");
    s.push(text(MARGIN, y, TITLE, palette::TEXT, &fit(title, TITLE)));
    y += text_height(TITLE) + 10;
    s.push(text(
        MARGIN,
        y,
        TEXT,
        palette::MUTED,
        &fit(&summary(t), TEXT),
    ));
    y += text_height(TEXT) + 14;
    y = legend(&mut s, y, width);
    y += 14;

    let x0 = MARGIN + LABEL_W;
    let x1 = width - MARGIN - 28;
    let span = t.end_us.saturating_sub(t.start_us).max(1);
    let x_of = |ts: u64| -> i32 {
        let dt = ts.saturating_sub(t.start_us).min(span) as f64;
        let x = f64::from(x0) + dt / span as f64 * f64::from(x1 - x0);
        x.round() as i32
    };

    // The axis's labels, then the lanes below them.
    let ticks = ticks(span, (x1 - x0) / 110);
    for &(at, ref label) in &ticks {
        s.push(Shape::Text {
            x: x_of(t.start_us.saturating_add(at)),
            y: y as i32,
            scale: TEXT,
            colour: palette::MUTED,
            anchor: Anchor::Middle,
            text: label.clone(),
            tip: None,
        });
    }
    y += text_height(TEXT) + 8;
    let lanes_top = y;
    let mut bands = Vec::with_capacity(t.lanes.len());
    for (i, lane) in t.lanes.iter().enumerate() {
        let rows = lane.rows.clamp(1, crate::model::MAX_ROWS);
        let h = (2 * LANE_PAD + rows * ROW_PITCH - (ROW_PITCH - BAR_H)).max(LANE_MIN_H);
        let fill = if i % 2 == 0 {
            palette::BACKGROUND
        } else {
            palette::LANE_ALT
        };
        s.push(rect(0, y, width, h, fill, None));
        bands.push(Band { top: y, height: h });
        y += h;
    }
    let lanes_bottom = y;
    // Grid lines under the bars, tick marks on the axis.
    for (at, _) in &ticks {
        let x = x_of(t.start_us.saturating_add(*at));
        s.push(Shape::Rect {
            x,
            y: lanes_top as i32,
            w: 1,
            h: lanes_bottom - lanes_top,
            fill: palette::GRID,
            tip: None,
        });
        s.push(Shape::Rect {
            x,
            y: lanes_top as i32 - 5,
            w: 1,
            h: 5,
            fill: palette::RULE,
            tip: None,
        });
    }
    s.push(rect(x0, lanes_top, x1 - x0 + 1, 1, palette::RULE, None));
    s.push(rect(x0, lanes_bottom, x1 - x0 + 1, 1, palette::RULE, None));

    for (lane, band) in t.lanes.iter().zip(&bands) {
        let colour = match lane.kind {
            LaneKind::Node => palette::TEXT,
            LaneKind::Coordinator | LaneKind::Folded(_) => palette::MUTED,
        };
        s.push(Shape::Text {
            x: MARGIN as i32,
            y: (band.top + LANE_PAD) as i32,
            scale: TEXT,
            colour,
            anchor: Anchor::Start,
            text: crate::events::cut(&lane.label, 13).to_string(),
            tip: Some(lane.id.clone()),
        });
        let row_y =
            |row: u32| band.top + LANE_PAD + row.min(crate::model::MAX_ROWS - 1) * ROW_PITCH;
        for m in lane.marks.iter().filter(|m| m.kind == MarkKind::Membership) {
            s.push(Shape::Rect {
                x: x_of(m.ts_us),
                y: (band.top + 2) as i32,
                w: 2,
                h: band.height - 4,
                fill: palette::MEMBERSHIP,
                tip: Some(m.text.clone()),
            });
        }
        // Where the next bar on the same row starts: a job label is drawn only where no later
        // bar will cover it (rows are shared once a lane has MAX_ROWS of them).
        let mut next_start = vec![i32::MAX; lane.bars.len()];
        let mut last_on_row: Vec<Option<usize>> = vec![None; crate::model::MAX_ROWS as usize];
        for (i, bar) in lane.bars.iter().enumerate() {
            let row = bar.row.min(crate::model::MAX_ROWS - 1) as usize;
            if let Some(prev) = last_on_row[row] {
                next_start[prev] = x_of(bar.start_us);
            }
            last_on_row[row] = Some(i);
        }
        // Red frames go on top of every bar, so an overlapping bar cannot hide one.
        let mut frames = Vec::new();
        for (i, bar) in lane.bars.iter().enumerate() {
            let (bx, ex) = (x_of(bar.start_us), x_of(bar.end_us));
            let w = u32::try_from(ex - bx).unwrap_or(0).max(2);
            let room = u32::try_from(next_start[i].saturating_sub(bx))
                .unwrap_or(0)
                .min(w);
            let y = row_y(bar.row);
            let fill = bar_colour(bar.kind);
            let mut tip = format!(
                "job {} - {} - {}",
                bar.job,
                bar.kind.label(),
                duration(bar.end_us.saturating_sub(bar.start_us))
            );
            if !bar.note.is_empty() {
                tip.push_str(" - ");
                tip.push_str(&bar.note);
            }
            if bar.flagged {
                tip.push_str(" - disagreement");
            }
            s.push(Shape::Rect {
                x: bx,
                y: y as i32,
                w,
                h: BAR_H,
                fill,
                tip: Some(tip),
            });
            let label = crate::events::cut(&bar.job, BAR_LABEL_CHARS);
            if room >= text_width(label, 1) + 8 && bar.kind == BarKind::Job {
                s.push(Shape::Text {
                    x: bx + 4,
                    y: (y + 4) as i32,
                    scale: 1,
                    colour: palette::ON_DARK,
                    anchor: Anchor::Start,
                    text: label.to_string(),
                    tip: None,
                });
            }
            if bar.flagged {
                frames.push(Shape::Frame {
                    x: bx - 1,
                    y: y as i32 - 1,
                    w: w + 2,
                    h: BAR_H + 2,
                    colour: palette::ALARM,
                    thickness: 2,
                });
            }
        }
        s.append(&mut frames);
        for m in lane.marks.iter().filter(|m| m.kind != MarkKind::Membership) {
            s.push(Shape::Text {
                x: x_of(m.ts_us),
                y: row_y(m.row) as i32,
                scale: TEXT,
                colour: palette::ALARM,
                anchor: Anchor::Middle,
                text: "X".into(),
                tip: Some(m.text.clone()),
            });
        }
    }
    y = lanes_bottom + 10;
    for note in &t.notes {
        s.push(text(MARGIN, y, TEXT, palette::MUTED, &fit(note, TEXT)));
        y += text_height(TEXT) + 6;
    }
    Scene {
        width,
        height: y + MARGIN,
        background: palette::BACKGROUND,
        shapes: s,
        bands,
        plot: (x0 as i32, x1 as i32),
    }
}

/// The legend, wrapped to the width; returns the y below it.
fn legend(s: &mut Vec<Shape>, top: u32, width: u32) -> u32 {
    let (mut x, mut y) = (MARGIN, top);
    let mut item = |s: &mut Vec<Shape>, label: &str, draw: &dyn Fn(&mut Vec<Shape>, u32, u32)| {
        let w = 16 + 8 + text_width(label, TEXT) + 28;
        if x > MARGIN && x + w > width - MARGIN {
            x = MARGIN;
            y += text_height(TEXT) + 10;
        }
        draw(s, x, y);
        s.push(text(x + 24, y, TEXT, palette::TEXT, label));
        x += w;
    };
    for kind in BarKind::ALL {
        item(s, kind.label(), &|s, x, y| {
            s.push(rect(x, y, 16, 16, bar_colour(kind), None));
        });
    }
    item(s, "disagreed / slashed", &|s, x, y| {
        s.push(rect(x, y + 2, 16, 12, palette::QUEUED, None));
        s.push(Shape::Frame {
            x: x as i32 - 1,
            y: y as i32 + 1,
            w: 18,
            h: 14,
            colour: palette::ALARM,
            thickness: 2,
        });
    });
    item(s, "node event", &|s, x, y| {
        s.push(rect(x + 7, y, 2, 16, palette::MEMBERSHIP, None));
    });
    y + text_height(TEXT)
}

fn rect(x: u32, y: u32, w: u32, h: u32, fill: Rgb, tip: Option<String>) -> Shape {
    Shape::Rect {
        x: x as i32,
        y: y as i32,
        w,
        h,
        fill,
        tip,
    }
}

fn text(x: u32, y: u32, scale: u32, colour: Rgb, text: &str) -> Shape {
    Shape::Text {
        x: x as i32,
        y: y as i32,
        scale,
        colour,
        anchor: Anchor::Start,
        text: text.to_string(),
        tip: None,
    }
}

/// "4 lanes, 5 jobs, 62 events from 4 logs; t = 0 at 2024-05-01 10:00:00.000 UTC".
fn summary(t: &Timeline) -> String {
    let plural = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    format!(
        "{}, {}, {} from {}; t = 0 at {}",
        plural(t.lanes.len() as u64, "lane", "lanes"),
        plural(t.jobs as u64, "job", "jobs"),
        plural(t.events, "event", "events"),
        plural(t.files as u64, "log", "logs"),
        utc(t.start_us)
    )
}

/// Ticks over `span` µs, at most about `want` of them, at 1, 2 or 5 × 10^k µs: (offset from
/// the start, label).
fn ticks(span: u64, want: u32) -> Vec<(u64, String)> {
    let want = u64::from(want.max(2));
    let mut step = 1u64;
    'search: for exp in 0..20u32 {
        for m in [1u64, 2, 5] {
            let candidate = m.saturating_mul(10u64.saturating_pow(exp));
            if span / candidate <= want {
                step = candidate;
                break 'search;
            }
        }
    }
    (0..=span / step)
        .map(|k| {
            let at = k * step;
            (at, tick_label(at, step))
        })
        .collect()
}

/// `at` µs with the precision `step` needs: "0", "250us", "1.5ms", "40ms", "2.5s".
fn tick_label(at: u64, step: u64) -> String {
    if at == 0 {
        "0".into()
    } else if step >= 1_000_000 {
        format!("{}s", at / 1_000_000)
    } else if step >= 100_000 {
        format!("{}.{}s", at / 1_000_000, at % 1_000_000 / 100_000)
    } else if step >= 1000 {
        format!("{}ms", at / 1000)
    } else if step >= 100 {
        format!("{}.{}ms", at / 1000, at % 1000 / 100)
    } else {
        format!("{at}us")
    }
}

/// A duration for a tooltip: "850us", "12.4ms", "3.20s".
pub fn duration(us: u64) -> String {
    if us < 1000 {
        format!("{us}us")
    } else if us < 1_000_000 {
        format!("{}.{}ms", us / 1000, us % 1000 / 100)
    } else {
        format!("{}.{:02}s", us / 1_000_000, us % 1_000_000 / 10_000)
    }
}

/// `ts_us` (µs since the Unix epoch) as a UTC date and time, to the millisecond.
pub fn utc(ts_us: u64) -> String {
    let secs = ts_us / 1_000_000;
    let ms = ts_us % 1_000_000 / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Days to a civil date (Howard Hinnant's algorithm), in i64: any u64 of µs fits.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{ms:03} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Bar, Lane, Mark};

    fn bar(job: &str, kind: BarKind, s: u64, e: u64, flagged: bool) -> Bar {
        Bar {
            job: job.into(),
            kind,
            start_us: s,
            end_us: e,
            flagged,
            row: 0,
            note: String::new(),
        }
    }

    fn lane(label: &str, bars: Vec<Bar>, marks: Vec<Mark>) -> Lane {
        Lane {
            label: label.into(),
            id: label.into(),
            kind: LaneKind::Node,
            bars,
            marks,
            rows: 1,
        }
    }

    fn sample() -> Timeline {
        Timeline {
            lanes: vec![
                lane(
                    "a",
                    vec![
                        bar("j1", BarKind::Queued, 1000, 2000, false),
                        bar("j1", BarKind::Computing, 2000, 6000, false),
                    ],
                    vec![],
                ),
                lane(
                    "b",
                    vec![bar("j1", BarKind::Computing, 3000, 9000, true)],
                    vec![Mark {
                        ts_us: 9500,
                        kind: MarkKind::Dissent,
                        row: 0,
                        text: "disagreed".into(),
                    }],
                ),
            ],
            start_us: 1000,
            end_us: 11_000,
            jobs: 1,
            files: 2,
            events: 9,
            skipped: 0,
            notes: vec![],
        }
    }

    /// The filled rectangles carrying tooltips (the bars), with the band each lies in.
    fn bars(scene: &Scene) -> Vec<(usize, i32, u32, Rgb)> {
        scene
            .shapes
            .iter()
            .filter_map(|s| match s {
                Shape::Rect {
                    x,
                    y,
                    w,
                    fill,
                    tip: Some(tip),
                    ..
                } if tip.starts_with("job ") => {
                    let lane = scene
                        .bands
                        .iter()
                        .position(|b| (*y as u32) >= b.top && (*y as u32) < b.top + b.height)
                        .unwrap();
                    Some((lane, *x, *w, *fill))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn bars_lie_in_their_lanes_in_time_order() {
        let scene = layout(&sample(), &Style::default());
        let b = bars(&scene);
        assert_eq!(b.len(), 3);
        assert_eq!(b[0].0, 0);
        assert_eq!(b[1].0, 0);
        assert_eq!(b[2].0, 1);
        // Queued ends where computing begins; b's bar starts after a's first.
        assert_eq!(b[0].1 + b[0].2 as i32, b[1].1);
        assert!(b[0].1 < b[2].1 && b[2].1 < b[1].1 + b[1].2 as i32);
        assert_eq!(b[0].3, palette::QUEUED);
        assert_eq!(b[1].3, palette::COMPUTING);
        // The axis spans the plot: the first event at its left end.
        assert_eq!(b[0].1, scene.plot.0);
        // Bands are stacked, top to bottom.
        assert_eq!(
            scene.bands[1].top,
            scene.bands[0].top + scene.bands[0].height
        );
        assert!(scene.height > scene.bands[1].top + scene.bands[1].height);
        assert_eq!(scene.width, DEFAULT_WIDTH);
    }

    #[test]
    fn dissent_is_framed_and_marked_in_red_on_its_lane_only() {
        let scene = layout(&sample(), &Style::default());
        let band = scene.bands[1];
        let in_band = |y: i32| y >= band.top as i32 - 1 && y < (band.top + band.height) as i32;
        let mut frames = 0;
        let mut marks = 0;
        for s in &scene.shapes {
            match s {
                // The legend has a red frame too, above the lanes; the rest are in b's band.
                Shape::Frame { y, colour, .. }
                    if *colour == palette::ALARM && *y > scene.bands[0].top as i32 =>
                {
                    assert!(in_band(*y), "{s:?}");
                    frames += 1;
                }
                Shape::Text {
                    y, colour, text, ..
                } if *colour == palette::ALARM => {
                    assert!(in_band(*y), "{s:?}");
                    assert_eq!(text, "X");
                    marks += 1;
                }
                Shape::Rect { fill, .. } => assert_ne!(*fill, palette::ALARM),
                _ => {}
            }
        }
        assert_eq!((frames, marks), (1, 1));
    }

    #[test]
    fn widths_are_clamped_and_height_grows_with_lanes() {
        let mut t = sample();
        let narrow = layout(
            &t,
            &Style {
                width: 10,
                title: None,
            },
        );
        assert_eq!(narrow.width, MIN_WIDTH);
        let h2 = narrow.height;
        t.lanes.push(lane("c", vec![], vec![]));
        t.lanes[2].rows = 3;
        let h3 = layout(
            &t,
            &Style {
                width: 10,
                title: None,
            },
        )
        .height;
        assert_eq!(h3 - h2, 2 * LANE_PAD + 3 * ROW_PITCH - (ROW_PITCH - BAR_H));
        let wide = layout(
            &t,
            &Style {
                width: u32::MAX,
                title: None,
            },
        );
        assert_eq!(wide.width, MAX_WIDTH);
    }

    #[test]
    fn ticks_step_by_1_2_5_and_label_in_units() {
        let t = ticks(10_000, 10);
        assert_eq!(t.len(), 11);
        assert_eq!(t[1], (1000, "1ms".to_string()));
        let t = ticks(3_200_000, 8);
        assert_eq!(t[1], (500_000, "0.5s".to_string()));
        assert_eq!(t[3], (1_500_000, "1.5s".to_string()));
        let t = ticks(1, 10);
        assert_eq!(t, vec![(0, "0".to_string()), (1, "1us".to_string())]);
        let t = ticks(u64::MAX, 10);
        assert!(t.len() <= 11 && t.len() >= 2, "{}", t.len());
        assert_eq!(duration(12_450), "12.4ms");
        assert_eq!(duration(3_204_000), "3.20s");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(utc(951_782_400_000_000), "2000-02-29 00:00:00.000 UTC");
        assert_eq!(utc(1_700_000_000_123_456), "2023-11-14 22:13:20.123 UTC");
        // Absurd times still format, without overflow.
        assert!(utc(u64::MAX).ends_with(" UTC"));
    }
}
