//! Sixel: a PNG drawn as the DEC terminals' bands of six pixel rows, for terminals that speak
//! sixel and neither kitty's protocol nor iTerm2's (foot, mlterm, contour, Konsole, xterm
//! built for it). Sixel carries palette indexes, so the image is decoded, scaled down to the
//! width it is drawn at, and given a palette of its most frequent colours.

use std::collections::HashMap;

/// The most pixels a figure may have to be decoded (a decompression bomb is not drawn).
const MAX_PIXELS: u64 = 25_000_000;

/// Colours in a palette (sixel terminals have at least 256 registers).
const PALETTE: usize = 256;

/// The escape sequence that draws the PNG `bytes` at most `max_width` pixels wide, then a line
/// break; `None` when it is not a PNG that decodes.
pub(crate) fn encode_png(bytes: &[u8], max_width: u32) -> Option<String> {
    let image = decode(bytes)?;
    let image = image.scaled_to(max_width.max(1));
    Some(encode(&image))
}

/// Opaque RGB pixels, row by row.
struct Rgb {
    width: u32,
    height: u32,
    pixels: Vec<[u8; 3]>,
}

fn decode(bytes: &[u8]) -> Option<Rgb> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().ok()?;
    let info = reader.info();
    if u64::from(info.width) * u64::from(info.height) > MAX_PIXELS {
        return None;
    }
    let mut buffer = vec![0; reader.output_buffer_size()?];
    let frame = reader.next_frame(&mut buffer).ok()?;
    let channels = frame.color_type.samples();
    let (width, height) = (frame.width, frame.height);
    let mut pixels = Vec::with_capacity(width as usize * height as usize);
    for row in buffer.chunks(frame.line_size).take(height as usize) {
        for px in row.chunks(channels).take(width as usize) {
            // Transparency is drawn over white, as the viewer and notebooks show figures.
            let (rgb, alpha) = match *px {
                [g] => ([g, g, g], 255),
                [g, a] => ([g, g, g], a),
                [r, g, b] => ([r, g, b], 255),
                [r, g, b, a] => ([r, g, b], a),
                _ => return None,
            };
            let over_white = |c: u8| {
                ((u16::from(c) * u16::from(alpha) + 255 * (255 - u16::from(alpha))) / 255) as u8
            };
            pixels.push(rgb.map(over_white));
        }
    }
    (pixels.len() == width as usize * height as usize).then_some(Rgb {
        width,
        height,
        pixels,
    })
}

impl Rgb {
    /// The image at most `max_width` wide, each pixel the average of those it covers.
    fn scaled_to(self, max_width: u32) -> Rgb {
        if self.width <= max_width {
            return self;
        }
        let width = max_width;
        let height =
            ((u64::from(self.height) * u64::from(width) / u64::from(self.width)) as u32).max(1);
        let mut pixels = Vec::with_capacity(width as usize * height as usize);
        for y in 0..height {
            let (y0, y1) = span(y, height, self.height);
            for x in 0..width {
                let (x0, x1) = span(x, width, self.width);
                let mut sum = [0u32; 3];
                for sy in y0..y1 {
                    for sx in x0..x1 {
                        let p = self.pixels[(sy * self.width + sx) as usize];
                        for c in 0..3 {
                            sum[c] += u32::from(p[c]);
                        }
                    }
                }
                let n = (y1 - y0) * (x1 - x0);
                pixels.push(sum.map(|s| (s / n) as u8));
            }
        }
        Rgb {
            width,
            height,
            pixels,
        }
    }
}

/// The source pixels `[start, end)` that scaled pixel `i` of `scaled` covers, out of `source`.
fn span(i: u32, scaled: u32, source: u32) -> (u32, u32) {
    let start = (u64::from(i) * u64::from(source) / u64::from(scaled)) as u32;
    let end = (u64::from(i + 1) * u64::from(source) / u64::from(scaled)) as u32;
    (start, end.max(start + 1).min(source))
}

/// A colour with five bits a channel: what the palette is chosen among.
fn bucket(p: [u8; 3]) -> u16 {
    (u16::from(p[0] >> 3) << 10) | (u16::from(p[1] >> 3) << 5) | u16::from(p[2] >> 3)
}

/// The palette (the most frequent colours, each the mean of its pixels) and each pixel's
/// index in it.
fn quantize(image: &Rgb) -> (Vec<[u8; 3]>, Vec<u8>) {
    let mut buckets: HashMap<u16, (u32, [u64; 3])> = HashMap::new();
    for p in &image.pixels {
        let (count, sum) = buckets.entry(bucket(*p)).or_default();
        *count += 1;
        for c in 0..3 {
            sum[c] += u64::from(p[c]);
        }
    }
    let mean = |(count, sum): &(u32, [u64; 3])| sum.map(|s| (s / u64::from(*count)) as u8);
    let mut by_count: Vec<(u16, u32)> = buckets.iter().map(|(b, (n, _))| (*b, *n)).collect();
    by_count.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let palette: Vec<[u8; 3]> = by_count
        .iter()
        .take(PALETTE)
        .map(|(b, _)| mean(&buckets[b]))
        .collect();
    let nearest = |colour: [u8; 3]| -> u8 {
        let distance = |p: &[u8; 3]| -> u32 {
            (0..3)
                .map(|c| {
                    (i32::from(p[c]) - i32::from(colour[c]))
                        .unsigned_abs()
                        .pow(2)
                })
                .sum()
        };
        (0..palette.len())
            .min_by_key(|i| distance(&palette[*i]))
            .unwrap_or(0) as u8
    };
    let index: HashMap<u16, u8> = buckets
        .iter()
        .map(|(b, stats)| (*b, nearest(mean(stats))))
        .collect();
    let indexes = image.pixels.iter().map(|p| index[&bucket(*p)]).collect();
    (palette, indexes)
}

fn encode(image: &Rgb) -> String {
    let (palette, indexes) = quantize(image);
    let (width, height) = (image.width as usize, image.height as usize);
    // DCS q, then the aspect ratio 1:1 and the size.
    let mut out = format!("\x1bP0;1;0q\"1;1;{width};{height}");
    for (i, [r, g, b]) in palette.iter().enumerate() {
        let percent = |c: u8| (u32::from(c) * 100 + 127) / 255;
        out.push_str(&format!(
            "#{i};2;{};{};{}",
            percent(*r),
            percent(*g),
            percent(*b)
        ));
    }
    for band in (0..height).step_by(6) {
        let rows = (height - band).min(6);
        let mut colours: Vec<u8> = (0..rows)
            .flat_map(|dy| &indexes[(band + dy) * width..(band + dy + 1) * width])
            .copied()
            .collect();
        colours.sort_unstable();
        colours.dedup();
        for (n, colour) in colours.iter().enumerate() {
            if n > 0 {
                out.push('$');
            }
            out.push_str(&format!("#{colour}"));
            let sixels = (0..width).map(|x| {
                let bits = (0..rows)
                    .filter(|dy| indexes[(band + dy) * width + x] == *colour)
                    .fold(0u8, |bits, dy| bits | (1 << dy));
                char::from(63 + bits)
            });
            run_length(&mut out, sixels);
        }
        out.push('-');
    }
    out.push_str("\x1b\\\n");
    out
}

/// Writes `sixels` with repeats as `!N` followed by the character.
fn run_length(out: &mut String, sixels: impl Iterator<Item = char>) {
    let mut run: Option<(char, usize)> = None;
    let flush = |out: &mut String, (c, n): (char, usize)| {
        if n > 3 {
            out.push_str(&format!("!{n}{c}"));
        } else {
            out.extend(std::iter::repeat_n(c, n));
        }
    };
    for c in sixels {
        run = match run {
            Some((last, n)) if last == c => Some((last, n + 1)),
            Some(done) => {
                flush(out, done);
                Some((c, 1))
            }
            None => Some((c, 1)),
        };
    }
    if let Some(done) = run {
        flush(out, done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PNG of `width`×`height` from `pixel(x, y)` (RGBA).
    fn png(width: u32, height: u32, pixel: impl Fn(u32, u32) -> [u8; 4]) -> Vec<u8> {
        let mut bytes = Vec::new();
        let mut encoder = png::Encoder::new(&mut bytes, width, height);
        encoder.set_color(png::ColorType::Rgba);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().unwrap();
        let mut data = Vec::new();
        for y in 0..height {
            for x in 0..width {
                data.extend(pixel(x, y));
            }
        }
        writer.write_image_data(&data).unwrap();
        drop(writer);
        bytes
    }

    #[test]
    fn a_two_colour_image_is_two_registers_and_its_bands() {
        // Left half red, right half transparent (drawn white); 4×7: two bands.
        let bytes = png(4, 7, |x, _| {
            if x < 2 {
                [255, 0, 0, 255]
            } else {
                [0, 0, 0, 0]
            }
        });
        let sixel = encode_png(&bytes, 600).unwrap();
        assert!(sixel.starts_with("\x1bP0;1;0q\"1;1;4;7"), "{sixel:?}");
        assert!(sixel.ends_with("\x1b\\\n"));
        assert!(
            sixel.contains("#0;2;100;0;0#1;2;100;100;100"),
            "red, white: {sixel:?}"
        );
        // The first band has six rows: `~` (all six bits) twice per colour, `?` (none) twice.
        let bands: Vec<&str> = sixel.split('-').collect();
        assert_eq!(bands.len(), 3, "two bands and the end: {sixel:?}");
        assert!(bands[0].ends_with("#0~~??$#1??~~"), "{sixel:?}");
        // The second band has one row: bit 0 only (`@`).
        assert_eq!(bands[1], "#0@@??$#1??@@", "{sixel:?}");
    }

    #[test]
    fn wide_images_are_scaled_and_runs_are_counted() {
        let bytes = png(100, 10, |_, _| [0, 0, 255, 255]);
        let sixel = encode_png(&bytes, 50).unwrap();
        assert!(sixel.contains("\"1;1;50;5"), "{sixel:?}");
        assert!(sixel.contains("#0!50^-"), "{sixel:?}");
    }

    #[test]
    fn what_is_not_a_png_is_not_drawn() {
        assert_eq!(encode_png(b"\x89PNG\r\n\x1a\nbroken", 600), None);
        assert_eq!(encode_png(b"GIF89a", 600), None);
        assert_eq!(encode_png(&[], 600), None);
    }

    #[test]
    fn many_colours_share_the_palette() {
        let bytes = png(64, 64, |x, y| [(x * 4) as u8, (y * 4) as u8, 128, 255]);
        let sixel = encode_png(&bytes, 600).unwrap();
        let registers = sixel.matches(";2;").count();
        assert!(registers <= PALETTE, "{registers}");
        assert!(registers > 200, "{registers}");
    }
}
