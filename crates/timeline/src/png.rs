//! The PNG renderer: a [`Scene`] rasterised into an RGB canvas (rectangles filled, clipped to
//! the canvas; text drawn from the bitmap font, each pixel a `scale`×`scale` square), then
//! encoded by hand: the signature, IHDR (8-bit RGB), one IDAT of zlib data (miniz_oxide) over
//! rows that each start with filter byte 0, IEND, every chunk with its CRC-32 from the table
//! below. No image crate: the format needs only this much, and the bytes are deterministic.

use crate::font;
use crate::layout::{Anchor, Rgb, Scene, Shape, text_width};

/// An RGB image, row-major, 3 bytes a pixel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Canvas {
    pub width: u32,
    pub height: u32,
    pub rgb: Vec<u8>,
}

impl Canvas {
    /// A canvas of `background`.
    pub fn new(width: u32, height: u32, background: Rgb) -> Canvas {
        let n = (width as usize).saturating_mul(height as usize);
        let mut rgb = Vec::with_capacity(n.saturating_mul(3));
        for _ in 0..n {
            rgb.extend_from_slice(&[background.0, background.1, background.2]);
        }
        Canvas { width, height, rgb }
    }

    /// The pixel at (`x`, `y`), or `None` outside.
    pub fn get(&self, x: u32, y: u32) -> Option<Rgb> {
        if x >= self.width || y >= self.height {
            return None;
        }
        let i = (y as usize * self.width as usize + x as usize) * 3;
        Some(Rgb(self.rgb[i], self.rgb[i + 1], self.rgb[i + 2]))
    }

    /// Fill a rectangle, clipped to the canvas. Coordinates are i64 so no input can overflow.
    pub fn fill(&mut self, x: i64, y: i64, w: i64, h: i64, c: Rgb) {
        let x0 = x.clamp(0, i64::from(self.width)) as usize;
        let y0 = y.clamp(0, i64::from(self.height)) as usize;
        let x1 = x.saturating_add(w).clamp(0, i64::from(self.width)) as usize;
        let y1 = y.saturating_add(h).clamp(0, i64::from(self.height)) as usize;
        if x1 <= x0 || y1 <= y0 {
            return;
        }
        let stride = self.width as usize * 3;
        for row in y0..y1 {
            let line = &mut self.rgb[row * stride + x0 * 3..row * stride + x1 * 3];
            for px in line.chunks_exact_mut(3) {
                px.copy_from_slice(&[c.0, c.1, c.2]);
            }
        }
    }

    /// Draw `text` with its cell's top-left at (`x`, `y`).
    pub fn text(&mut self, x: i64, y: i64, scale: u32, c: Rgb, text: &str) {
        let s = i64::from(scale);
        let advance = i64::from(font::ADVANCE) * s;
        for (i, ch) in text.chars().enumerate() {
            let gx = x.saturating_add((i as i64).saturating_mul(advance));
            if gx >= i64::from(self.width) {
                break;
            }
            for row in 0..font::GLYPH_H {
                for col in 0..font::GLYPH_W {
                    if font::pixel(ch, col, row) {
                        let px = gx + i64::from(col) * s;
                        let py = y.saturating_add(i64::from(row) * s);
                        self.fill(px, py, s, s, c);
                    }
                }
            }
        }
    }

    /// Draw every shape of `scene` in order.
    pub fn draw(&mut self, scene: &Scene) {
        for shape in &scene.shapes {
            match shape {
                Shape::Rect {
                    x, y, w, h, fill, ..
                } => self.fill(
                    i64::from(*x),
                    i64::from(*y),
                    i64::from(*w),
                    i64::from(*h),
                    *fill,
                ),
                Shape::Frame {
                    x,
                    y,
                    w,
                    h,
                    colour,
                    thickness,
                } => {
                    let (x, y, w, h) = (i64::from(*x), i64::from(*y), i64::from(*w), i64::from(*h));
                    let t = i64::from(*thickness).min(w).min(h);
                    self.fill(x, y, w, t, *colour);
                    self.fill(x, y + h - t, w, t, *colour);
                    self.fill(x, y, t, h, *colour);
                    self.fill(x + w - t, y, t, h, *colour);
                }
                Shape::Text {
                    x,
                    y,
                    scale,
                    colour,
                    anchor,
                    text,
                    ..
                } => {
                    let w = i64::from(text_width(text, *scale));
                    let x = i64::from(*x)
                        - match anchor {
                            Anchor::Start => 0,
                            Anchor::Middle => w / 2,
                            Anchor::End => w,
                        };
                    self.text(x, i64::from(*y), *scale, *colour, text);
                }
            }
        }
    }
}

/// The scene as PNG bytes.
pub fn render(scene: &Scene) -> Vec<u8> {
    let mut canvas = Canvas::new(scene.width, scene.height, scene.background);
    canvas.draw(scene);
    encode(&canvas)
}

/// A canvas as a PNG file: 8-bit RGB, no interlacing, filter 0 on every row.
pub fn encode(canvas: &Canvas) -> Vec<u8> {
    let stride = canvas.width as usize * 3;
    let mut raw = Vec::with_capacity((stride + 1).saturating_mul(canvas.height as usize));
    for row in canvas.rgb.chunks_exact(stride.max(1)) {
        raw.push(0);
        raw.extend_from_slice(row);
    }
    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend_from_slice(&canvas.width.to_be_bytes());
    ihdr.extend_from_slice(&canvas.height.to_be_bytes());
    // Bit depth 8, colour type 2 (RGB), compression 0, filter method 0, no interlace.
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let idat = miniz_oxide::deflate::compress_to_vec_zlib(&raw, 6);
    let mut out = Vec::with_capacity(idat.len() + 64);
    out.extend_from_slice(&SIGNATURE);
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &idat);
    chunk(&mut out, b"IEND", &[]);
    out
}

/// The eight bytes every PNG file starts with.
pub const SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];

/// Append one chunk: length, type, data, CRC-32 of type and data.
fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    // Chunks hold at most 2^31 - 1 bytes; ours are far smaller (the canvas is bounded by the
    // layout's limits), and `try_from` keeps that an explicit assumption rather than a wrap.
    let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32_update(crc32_update(!0, kind), data);
    out.extend_from_slice(&(!crc).to_be_bytes());
}

/// CRC-32 (ISO-HDLC, the one PNG and zlib's gzip use) of `bytes`.
pub fn crc32(bytes: &[u8]) -> u32 {
    !crc32_update(!0, bytes)
}

fn crc32_update(mut crc: u32, bytes: &[u8]) -> u32 {
    for &b in bytes {
        crc = CRC_TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

/// The byte-at-a-time table of the reflected polynomial 0xEDB88320, built at compile time.
const CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut n = 0;
    while n < 256 {
        let mut c = n as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[n] = c;
        n += 1;
    }
    table
};

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A decoded PNG: what the tests check.
    pub(crate) struct Decoded {
        pub width: u32,
        pub height: u32,
        pub rgb: Vec<u8>,
    }

    impl Decoded {
        pub fn at(&self, x: u32, y: u32) -> Rgb {
            let i = (y as usize * self.width as usize + x as usize) * 3;
            Rgb(self.rgb[i], self.rgb[i + 1], self.rgb[i + 2])
        }
    }

    /// Decode the PNGs this module writes (8-bit RGB, filter 0), checking every chunk's CRC.
    pub(crate) fn decode(png: &[u8]) -> Decoded {
        assert_eq!(png[..8], SIGNATURE);
        let (mut pos, mut ihdr, mut idat, mut ended) = (8, None, Vec::new(), false);
        while pos < png.len() {
            let len = u32::from_be_bytes(png[pos..pos + 4].try_into().unwrap()) as usize;
            let kind = &png[pos + 4..pos + 8];
            let data = &png[pos + 8..pos + 8 + len];
            let crc = u32::from_be_bytes(png[pos + 8 + len..pos + 12 + len].try_into().unwrap());
            assert_eq!(crc, crc32(&png[pos + 4..pos + 8 + len]), "CRC of {kind:?}");
            match kind {
                b"IHDR" => ihdr = Some(data.to_vec()),
                b"IDAT" => idat.extend_from_slice(data),
                b"IEND" => ended = true,
                other => panic!("unexpected chunk {other:?}"),
            }
            pos += 12 + len;
        }
        assert!(ended, "no IEND");
        let ihdr = ihdr.expect("IHDR");
        let width = u32::from_be_bytes(ihdr[0..4].try_into().unwrap());
        let height = u32::from_be_bytes(ihdr[4..8].try_into().unwrap());
        assert_eq!(ihdr[8..], [8, 2, 0, 0, 0]);
        let raw = miniz_oxide::inflate::decompress_to_vec_zlib(&idat).expect("zlib");
        let stride = width as usize * 3;
        assert_eq!(raw.len(), (stride + 1) * height as usize);
        let mut rgb = Vec::with_capacity(stride * height as usize);
        for row in raw.chunks_exact(stride + 1) {
            assert_eq!(row[0], 0, "filter byte");
            rgb.extend_from_slice(&row[1..]);
        }
        Decoded { width, height, rgb }
    }

    #[test]
    fn crc32_known_values() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(
            crc32(b"The quick brown fox jumps over the lazy dog"),
            0x414F_A339
        );
        // Every PNG's IEND chunk ends in the CRC of its type alone.
        assert_eq!(crc32(b"IEND"), 0xAE42_6082);
    }

    #[test]
    fn a_canvas_round_trips_through_the_encoder() {
        let mut c = Canvas::new(7, 5, Rgb(10, 20, 30));
        c.fill(2, 1, 3, 2, Rgb(200, 0, 0));
        // Clipped on every side without a panic.
        c.fill(-100, -100, 101, 101, Rgb(0, 255, 0));
        c.fill(6, 4, i64::MAX, i64::MAX, Rgb(0, 0, 255));
        c.fill(i64::MIN, i64::MIN, i64::MAX, 3, Rgb(1, 1, 1));
        c.fill(5, 1, -3, 2, Rgb(1, 1, 1));
        let png = encode(&c);
        let d = decode(&png);
        assert_eq!((d.width, d.height), (7, 5));
        assert_eq!(d.rgb, c.rgb);
        assert_eq!(d.at(0, 0), Rgb(0, 255, 0));
        assert_eq!(d.at(3, 2), Rgb(200, 0, 0));
        assert_eq!(d.at(6, 4), Rgb(0, 0, 255));
        assert_eq!(d.at(6, 3), Rgb(10, 20, 30));
        assert_eq!(png[png.len() - 8..], *b"IEND\xAE\x42\x60\x82");
    }

    #[test]
    fn text_draws_glyph_pixels_scaled() {
        let mut c = Canvas::new(40, 20, Rgb(255, 255, 255));
        c.text(1, 1, 2, Rgb(0, 0, 0), "|");
        // '|' is column 2 of the glyph, rows 0-6: at scale 2, x 5..7, y 1..15.
        for y in 0..20 {
            for x in 0..40 {
                let ink = (5..7).contains(&x) && (1..15).contains(&y);
                assert_eq!(c.get(x, y) == Some(Rgb(0, 0, 0)), ink, "({x}, {y})");
            }
        }
        // Text running off the canvas is clipped.
        c.text(30, 15, 3, Rgb(0, 0, 0), "WWWWWWWW\u{1F600}");
    }
}
