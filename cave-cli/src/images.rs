//! Images drawn in the terminal, where it speaks an image protocol: kitty's graphics protocol,
//! iTerm2's inline images (which WezTerm and others speak too), or sixel (foot, mlterm,
//! contour, Konsole). Detected from the variables terminals set; off everywhere else, and
//! inside tmux or screen, which do not pass them on. `cave --images` chooses one by hand.

use base64::Engine as _;

/// An image protocol a terminal speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageProtocol {
    /// kitty's graphics protocol (PNG sent in chunks).
    Kitty,
    /// iTerm2's inline images (`OSC 1337 File=`).
    Iterm2,
    /// DEC sixel graphics (PNG decoded and drawn with a palette of its colours).
    Sixel,
}

/// How many pixels a column is taken to be when a sixel image is sized (terminals' cells are
/// 7 to 12 pixels wide; sixel has no unit but the pixel).
const SIXEL_PIXELS_PER_COLUMN: u32 = 10;

/// The widest an image is drawn, in columns.
pub const IMAGE_COLUMNS: u32 = 60;

impl ImageProtocol {
    /// The protocol of the terminal `var` describes (`TERM`, `TERM_PROGRAM`, `LC_TERMINAL`,
    /// `KITTY_WINDOW_ID`, `KONSOLE_VERSION`, `TMUX`, `STY`), if it speaks one. xterm speaks
    /// sixel only when built and started for it, which its variables do not say: `--images
    /// sixel` there.
    pub fn detect(var: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let term = var("TERM").unwrap_or_default();
        if var("TMUX").is_some() || var("STY").is_some() || term.starts_with("screen") {
            return None;
        }
        if term == "xterm-kitty" || var("KITTY_WINDOW_ID").is_some() {
            return Some(ImageProtocol::Kitty);
        }
        let program = var("TERM_PROGRAM").unwrap_or_default();
        if matches!(program.as_str(), "iTerm.app" | "WezTerm")
            || var("LC_TERMINAL").as_deref() == Some("iTerm2")
        {
            return Some(ImageProtocol::Iterm2);
        }
        let sixel_terms = ["foot", "mlterm", "contour"];
        // Konsole draws sixel from 22.04 (KONSOLE_VERSION 220400).
        let konsole = var("KONSOLE_VERSION")
            .and_then(|v| v.trim().parse::<u32>().ok())
            .is_some_and(|v| v >= 220_400);
        if sixel_terms.iter().any(|t| term.starts_with(t)) || konsole {
            return Some(ImageProtocol::Sixel);
        }
        None
    }

    /// The escape sequences that draw `bytes` (of type `mime`) at most `columns` wide, then a
    /// line break; `None` for an image the protocol does not take (kitty's and sixel take
    /// PNG).
    pub fn encode(self, mime: &str, bytes: &[u8], columns: u32) -> Option<String> {
        // Raster images only (neither protocol draws SVG or HTML).
        if !matches!(mime, "image/png" | "image/jpeg" | "image/gif") {
            return None;
        }
        if self == ImageProtocol::Sixel {
            return (mime == "image/png")
                .then(|| crate::sixel::encode_png(bytes, columns * SIXEL_PIXELS_PER_COLUMN))
                .flatten();
        }
        let data = base64::engine::general_purpose::STANDARD.encode(bytes);
        match self {
            ImageProtocol::Kitty if mime == "image/png" => {
                // Chunks of at most 4096 base64 bytes; `m=1` on all but the last.
                let chunks: Vec<&str> = data
                    .as_bytes()
                    .chunks(4096)
                    .map(|c| std::str::from_utf8(c).unwrap_or_default())
                    .collect();
                let mut out = String::new();
                for (i, chunk) in chunks.iter().enumerate() {
                    let more = u8::from(i + 1 < chunks.len());
                    if i == 0 {
                        out.push_str(&format!(
                            "\x1b_Gf=100,a=T,c={columns},m={more};{chunk}\x1b\\"
                        ));
                    } else {
                        out.push_str(&format!("\x1b_Gm={more};{chunk}\x1b\\"));
                    }
                }
                out.push('\n');
                Some(out)
            }
            ImageProtocol::Kitty => None,
            ImageProtocol::Sixel => None,
            ImageProtocol::Iterm2 => Some(format!(
                "\x1b]1337;File=inline=1;size={};width={columns};preserveAspectRatio=1:{data}\x07\n",
                bytes.len()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detect(vars: &[(&str, &str)]) -> Option<ImageProtocol> {
        ImageProtocol::detect(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn the_protocol_is_detected_and_off_by_default() {
        assert_eq!(
            detect(&[("TERM", "xterm-kitty")]),
            Some(ImageProtocol::Kitty)
        );
        assert_eq!(
            detect(&[("TERM", "xterm-256color"), ("TERM_PROGRAM", "iTerm.app")]),
            Some(ImageProtocol::Iterm2)
        );
        assert_eq!(
            detect(&[("LC_TERMINAL", "iTerm2")]),
            Some(ImageProtocol::Iterm2)
        );
        assert_eq!(detect(&[("TERM", "xterm-256color")]), None);
        assert_eq!(detect(&[("TERM", "foot")]), Some(ImageProtocol::Sixel));
        assert_eq!(
            detect(&[("TERM", "mlterm-256color")]),
            Some(ImageProtocol::Sixel)
        );
        assert_eq!(
            detect(&[("TERM", "xterm-256color"), ("KONSOLE_VERSION", "230805")]),
            Some(ImageProtocol::Sixel)
        );
        assert_eq!(
            detect(&[("TERM", "xterm-256color"), ("KONSOLE_VERSION", "211200")]),
            None,
            "Konsole before 22.04 draws no sixel"
        );
        assert_eq!(detect(&[("TERM", "foot"), ("TMUX", "x")]), None);
        assert_eq!(detect(&[]), None);
        assert_eq!(
            detect(&[("TERM", "xterm-kitty"), ("TMUX", "/tmp/tmux-0/default,1,0")]),
            None,
            "tmux does not pass the sequences on"
        );
    }

    #[test]
    fn kitty_sends_png_in_chunks_and_iterm2_in_one_sequence() {
        let png: Vec<u8> = (0..7000u32).map(|i| (i % 251) as u8).collect();
        let kitty = ImageProtocol::Kitty.encode("image/png", &png, 60).unwrap();
        let parts: Vec<&str> = kitty
            .trim_end()
            .split("\x1b\\")
            .filter(|p| !p.is_empty())
            .collect();
        // 7000 bytes are 9336 base64 characters: three chunks.
        assert_eq!(parts.len(), 3, "{parts:?}");
        assert!(parts[0].starts_with("\x1b_Gf=100,a=T,c=60,m=1;"));
        assert!(parts[1].starts_with("\x1b_Gm=1;"));
        assert!(parts[2].starts_with("\x1b_Gm=0;"));
        let joined: String = parts.iter().map(|p| p.split_once(';').unwrap().1).collect();
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(joined)
                .unwrap(),
            png
        );
        assert_eq!(ImageProtocol::Kitty.encode("image/jpeg", &png, 60), None);
        assert_eq!(ImageProtocol::Iterm2.encode("text/html", b"<b>", 60), None);
        assert_eq!(
            ImageProtocol::Iterm2.encode("image/svg+xml", b"<svg/>", 60),
            None
        );
        let iterm = ImageProtocol::Iterm2
            .encode("image/jpeg", b"jpg", 40)
            .unwrap();
        assert_eq!(
            iterm,
            "\x1b]1337;File=inline=1;size=3;width=40;preserveAspectRatio=1:anBn\x07\n"
        );
    }
}
