//! The SVG renderer: each shape of a [`Scene`] as one element, text as real `<text>` in a
//! monospace font sized to the bitmap font's cells (10 px per unit of scale gives the 6 px
//! advance of common monospace faces), bars with `<title>` tooltips naming the job, phase and
//! duration. Every attribute is an integer or escaped text, so the same scene always gives the
//! same bytes.

use std::fmt::Write;

use crate::font;
use crate::layout::{Anchor, Scene, Shape};

/// The scene as an SVG document.
pub fn render(scene: &Scene) -> String {
    let mut out = String::with_capacity(256 + scene.shapes.len() * 96);
    let (w, h) = (scene.width, scene.height);
    // `write!` into a String cannot fail; the results are ignored for that reason.
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" \
         font-family=\"DejaVu Sans Mono, Menlo, Consolas, monospace\">"
    );
    let _ = writeln!(
        out,
        "<rect width=\"{w}\" height=\"{h}\" fill=\"{}\"/>",
        scene.background.hex()
    );
    for shape in &scene.shapes {
        match shape {
            Shape::Rect {
                x,
                y,
                w,
                h,
                fill,
                tip,
            } => {
                let _ = write!(
                    out,
                    "<rect x=\"{x}\" y=\"{y}\" width=\"{w}\" height=\"{h}\" fill=\"{}\"",
                    fill.hex()
                );
                close(&mut out, "rect", tip.as_deref());
            }
            Shape::Frame {
                x,
                y,
                w,
                h,
                colour,
                thickness,
            } => {
                // SVG strokes straddle the outline: inset by half the thickness to stay inside
                // the bounds, as the PNG draws it. Doubled coordinates keep it in integers.
                let t = *thickness;
                let _ = writeln!(
                    out,
                    "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{t}\"/>",
                    half(2 * i64::from(*x) + i64::from(t)),
                    half(2 * i64::from(*y) + i64::from(t)),
                    (i64::from(*w) - i64::from(t)).max(0),
                    (i64::from(*h) - i64::from(t)).max(0),
                    colour.hex()
                );
            }
            Shape::Text {
                x,
                y,
                scale,
                colour,
                anchor,
                text,
                tip,
            } => {
                let anchor = match anchor {
                    Anchor::Start => "start",
                    Anchor::Middle => "middle",
                    Anchor::End => "end",
                };
                let baseline = i64::from(*y) + i64::from(font::ASCENT * scale);
                let _ = write!(
                    out,
                    "<text x=\"{x}\" y=\"{baseline}\" font-size=\"{}\" fill=\"{}\" text-anchor=\"{anchor}\"",
                    10 * scale,
                    colour.hex()
                );
                if let Some(tip) = tip {
                    let _ = write!(out, "><title>{}</title>", escape(tip));
                    let _ = writeln!(out, "{}</text>", escape(text));
                } else {
                    let _ = writeln!(out, ">{}</text>", escape(text));
                }
            }
        }
    }
    out.push_str("</svg>\n");
    out
}

/// Close an element, with a `<title>` child when there is a tooltip.
fn close(out: &mut String, name: &str, tip: Option<&str>) {
    match tip {
        Some(tip) => {
            let _ = writeln!(out, "><title>{}</title></{name}>", escape(tip));
        }
        None => out.push_str("/>\n"),
    }
}

/// `v / 2` written exactly: an integer or a `.5`.
fn half(v: i64) -> String {
    let sign = if v < 0 { "-" } else { "" };
    let m = v.unsigned_abs();
    if m.is_multiple_of(2) {
        format!("{sign}{}", m / 2)
    } else {
        format!("{sign}{}.5", m / 2)
    }
}

/// Text made safe for XML content and attributes; control characters (not allowed in XML 1.0)
/// become `?`.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Rgb;

    #[test]
    fn shapes_become_elements_and_text_is_escaped() {
        let scene = Scene {
            width: 100,
            height: 50,
            background: Rgb(255, 255, 255),
            shapes: vec![
                Shape::Rect {
                    x: 1,
                    y: 2,
                    w: 3,
                    h: 4,
                    fill: Rgb(255, 0, 16),
                    tip: Some("job <a&b>".into()),
                },
                Shape::Frame {
                    x: 10,
                    y: 10,
                    w: 20,
                    h: 10,
                    colour: Rgb(0, 0, 0),
                    thickness: 1,
                },
                Shape::Text {
                    x: 5,
                    y: 6,
                    scale: 2,
                    colour: Rgb(1, 2, 3),
                    anchor: Anchor::Middle,
                    text: "a\"b\u{1}".into(),
                    tip: None,
                },
            ],
            bands: vec![],
            plot: (0, 100),
        };
        let svg = render(&scene);
        assert!(
            svg.starts_with(
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"100\" height=\"50\""
            )
        );
        assert!(svg.contains(
            "<rect x=\"1\" y=\"2\" width=\"3\" height=\"4\" fill=\"#ff0010\"><title>job &lt;a&amp;b&gt;</title></rect>"
        ), "{svg}");
        assert!(svg.contains(
            "<rect x=\"10.5\" y=\"10.5\" width=\"19\" height=\"9\" fill=\"none\" stroke=\"#000000\" stroke-width=\"1\"/>"
        ), "{svg}");
        assert!(svg.contains(
            "<text x=\"5\" y=\"20\" font-size=\"20\" fill=\"#010203\" text-anchor=\"middle\">a&quot;b?</text>"
        ), "{svg}");
        assert!(svg.ends_with("</svg>\n"));
    }

    #[test]
    fn halves() {
        assert_eq!(half(4), "2");
        assert_eq!(half(5), "2.5");
        assert_eq!(half(-3), "-1.5");
        assert_eq!(half(-1), "-0.5");
        assert_eq!(half(-4), "-2");
    }
}
