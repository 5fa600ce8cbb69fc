//! The display protocol: `display(obj)`, objects' `_repr_*_` forms, a rich last value,
//! matplotlib figures, and the bound on a form's size.

use cave_cell::show_from_host;
use cave_core::{
    Args, DisplayData, DisplayItem, Execution, Function, OutputSink, Resources, Runtime, Signature,
    Value,
};
use std::sync::Mutex;

/// Collects a cell's text and items, in order.
#[derive(Debug, Default)]
pub struct Shown {
    pieces: Mutex<Vec<Piece>>,
}

/// A piece of a cell's live output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Text.
    Text(String),
    /// An item.
    Item(DisplayItem),
}

impl OutputSink for Shown {
    fn write(&self, chunk: &str) {
        let mut pieces = cave_core::lock(&self.pieces);
        match pieces.last_mut() {
            Some(Piece::Text(text)) => text.push_str(chunk),
            _ => pieces.push(Piece::Text(chunk.to_owned())),
        }
    }

    fn display(&self, item: DisplayItem) {
        cave_core::lock(&self.pieces).push(Piece::Item(item));
    }
}

impl Shown {
    /// The items, in order.
    pub fn items(&self) -> Vec<DisplayItem> {
        cave_core::lock(&self.pieces)
            .iter()
            .filter_map(|p| match p {
                Piece::Item(item) => Some(item.clone()),
                Piece::Text(_) => None,
            })
            .collect()
    }

    /// Everything, in order.
    pub fn pieces(&self) -> Vec<Piece> {
        cave_core::lock(&self.pieces).clone()
    }
}

/// Runs a cell, collecting what it shows.
pub async fn run_shown(rt: &dyn Runtime, code: &str) -> (Execution, Shown) {
    let shown = Shown::default();
    let execution = rt.execute(code, &shown).await.expect("the runtime works");
    (execution, shown)
}

/// A class with every `_repr_*_` form: the PNG and JPEG are real headers of a 3×2 image.
const EVERY_FORM: &str = r#"
class Rich:
    def _repr_html_(self): return "<b>rich</b>"
    def _repr_markdown_(self): return "**rich**"
    def _repr_svg_(self): return "<svg xmlns='http://www.w3.org/2000/svg'/>"
    def _repr_png_(self):
        return b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x03\x00\x00\x00\x02"
    def _repr_jpeg_(self): return b"\xff\xd8\xff\xc0\x00\x11\x08\x00\x02\x00\x03"
    def _repr_json_(self): return {"rich": [1, 2]}
    def _repr_latex_(self): return r"$\alpha$"
    def __repr__(self): return "Rich()"
"#;

/// `display(obj)` sends one item with each form the object has, in IPython's order, its text
/// form written into the output where it was shown.
pub async fn display_sends_every_rich_form(rt: &dyn Runtime) {
    let (out, shown) = run_shown(
        rt,
        &format!("{EVERY_FORM}\nprint('before')\ndisplay(Rich())\nprint('after')"),
    )
    .await;
    assert!(out.success(), "{out:?}");
    assert_eq!(out.output, "before\nRich()\nafter\n");
    let items = shown.items();
    assert_eq!(items.len(), 1, "{items:?}");
    let item = &items[0];
    assert_eq!(
        item.mime_types(),
        [
            "text/html",
            "text/markdown",
            "image/svg+xml",
            "image/png",
            "image/jpeg",
            "application/json",
            "text/latex",
            "text/plain"
        ]
    );
    assert_eq!(item.text(), "Rich()");
    assert_eq!(
        item.get("text/html"),
        Some(&DisplayData::Text("<b>rich</b>".into()))
    );
    let png = item.get("image/png").expect("a png");
    assert!(matches!(png, DisplayData::Bytes(_)), "{png:?}");
    assert_eq!(
        cave_core::image_size("image/png", png.as_bytes()),
        Some((3, 2))
    );
    assert_eq!(
        item.get("application/json"),
        Some(&DisplayData::Text(r#"{"rich": [1, 2]}"#.into()))
    );
    // In order with the text around it.
    let pieces = shown.pieces();
    let at = pieces
        .iter()
        .position(|p| matches!(p, Piece::Item(_)))
        .expect("the item");
    assert!(
        matches!(&pieces[at - 1], Piece::Text(t) if t.ends_with("Rich()\n")),
        "{pieces:?}"
    );
    assert!(
        matches!(&pieces[at + 1], Piece::Text(t) if t.starts_with("after")),
        "{pieces:?}"
    );
}

/// A cell's last value with a rich form is echoed as its text and shown as an item; one
/// without is echoed only; a broken `_repr_*_` is left out, not raised.
pub async fn a_rich_last_value_is_shown_as_an_item(rt: &dyn Runtime) {
    let code = "class Table:\n    def _repr_html_(self): return '<table><tr><td>1</td></tr></table>'\n    def __repr__(self): return 'Table(1 row)'\nTable()";
    let (out, shown) = run_shown(rt, code).await;
    assert_eq!(out.output, "Table(1 row)\n");
    let items = shown.items();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].mime_types(), ["text/html", "text/plain"]);
    let (out, shown) = run_shown(rt, "41 + 1").await;
    assert_eq!(out.output, "42\n");
    assert!(shown.items().is_empty());
    let code = "class Broken:\n    def _repr_html_(self): raise ValueError('no')\n    def _repr_png_(self): return 'not bytes or base64 !'\n    def __repr__(self): return 'Broken()'\ndisplay(Broken())";
    let (out, shown) = run_shown(rt, code).await;
    assert!(out.success(), "{out:?}");
    let items = shown.items();
    assert_eq!(items[0].mime_types(), ["text/plain"], "{items:?}");
    // An object whose attribute lookup raises has no rich form; it is echoed.
    let code = "class Evil:\n    def __getattr__(self, name): raise RuntimeError(name)\n    def __repr__(self): return 'Evil()'\nEvil()";
    let (out, shown) = run_shown(rt, code).await;
    assert_eq!(out.output, "Evil()\n", "{out:?}");
    assert!(shown.items().is_empty());
    // A class has the methods, unbound: it is not shown as an instance.
    let (out, shown) = run_shown(rt, "Table").await;
    assert!(out.output.starts_with("<class"), "{out:?}");
    assert!(shown.items().is_empty());
}

/// `_repr_mimebundle_` and `display(bundle, raw=True)` are taken as given (images may come as
/// base64, as Jupyter bundles carry them).
pub async fn mime_bundles_are_taken_as_given(rt: &dyn Runtime) {
    let code = r##"
import base64
class Bundled:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": "bundled", "image/png": base64.b64encode(b"\x89PNG-bytes").decode()}
display(Bundled())
display({"text/markdown": "# Title", "text/plain": "Title"}, raw=True)
"##;
    let (out, shown) = run_shown(rt, code).await;
    assert!(out.success(), "{out:?}");
    assert_eq!(out.output, "bundled\nTitle\n");
    let items = shown.items();
    assert_eq!(items.len(), 2);
    assert_eq!(
        items[0].get("image/png"),
        Some(&DisplayData::Bytes(b"\x89PNG-bytes".to_vec()))
    );
    assert_eq!(items[1].mime_types(), ["text/markdown", "text/plain"]);
}

/// A form larger than the display limit (16 MiB by default) is left out and named with its
/// size; the rest of the item arrives.
pub async fn a_form_over_the_display_limit_is_left_out(rt: &dyn Runtime) {
    let code = r#"display({"text/plain": "big", "image/png": b"\x89PNG" + bytes(17 << 20), "text/html": "<i>small</i>"}, raw=True)"#;
    let (out, shown) = run_shown(rt, code).await;
    assert!(out.success(), "{out:?}");
    let items = shown.items();
    assert_eq!(
        items[0].mime_types(),
        ["text/plain", "text/html"],
        "as given"
    );
    assert_eq!(items[0].omitted, [("image/png".to_owned(), (17 << 20) + 4)]);
}

/// Figures drawn with matplotlib are shown as PNG items: at `plt.show()`, where it is called,
/// and those left open when the cell ends; matplotlib is not imported by a cell that does not
/// use it. Skipped (with a note) where `CAVE_TEST_NO_MATPLOTLIB` is set.
pub async fn matplotlib_figures_are_shown(rt: &dyn Runtime) {
    if std::env::var_os("CAVE_TEST_NO_MATPLOTLIB").is_some() {
        eprintln!("skipped: CAVE_TEST_NO_MATPLOTLIB is set");
        return;
    }
    let (out, _) = run_shown(rt, "import sys\nprint('matplotlib' in sys.modules)").await;
    assert_eq!(
        out.output, "False\n",
        "nothing imports matplotlib for a cell"
    );
    let code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\nprint('between')\nplt.figure(figsize=(2, 1))\nplt.bar(['a', 'b'], [3, 4])";
    let (out, shown) = run_shown(rt, code).await;
    assert!(
        out.success(),
        "matplotlib is installed in the test Python (cargo xtask test installs it): {out:?}"
    );
    let items = shown.items();
    assert_eq!(items.len(), 2, "{out:?} {items:?}");
    for item in &items {
        let png = item.get("image/png").expect("a png");
        let (width, height) =
            cave_core::image_size("image/png", png.as_bytes()).expect("a png header");
        assert!(width > 50 && height > 20, "{width}×{height}");
        assert!(item.text().starts_with("<Figure size"), "{}", item.text());
    }
    let pieces = shown.pieces();
    assert!(
        matches!(&pieces[1], Piece::Item(_))
            && matches!(&pieces[2], Piece::Text(t) if t.contains("between")),
        "the first figure at plt.show(), before what follows: {pieces:?}"
    );
    // Closed once shown: the next cell shows nothing.
    let (_, shown) = run_shown(rt, "1").await;
    assert!(shown.items().is_empty());
}

/// An item a host function shows (`show_from_host`: an MCP tool's image) reaches the cell that
/// called it, as the cell's own items do; outside a cell's call nothing takes it.
pub async fn a_host_function_can_show_an_item(rt: &dyn Runtime) {
    let chart = Function::host(
        "chart",
        Signature::default().returns("str"),
        |_args: Args| async move {
            let item = DisplayItem::new([
                (
                    "image/png".to_owned(),
                    DisplayData::Bytes(b"\x89PNG\r\n\x1a\n".to_vec()),
                ),
                ("text/plain".to_owned(), DisplayData::Text("<chart>".into())),
            ]);
            let shown = if show_from_host(item) {
                "shown"
            } else {
                "not shown"
            };
            Ok(Value::Str(shown.into()))
        },
    );
    rt.register(Resources::new().function(chart))
        .await
        .expect("registers");
    let (out, shown) = run_shown(rt, "print(chart())\ndisplay('own')").await;
    assert_eq!(out.output, "shown\n'own'\n", "{out:?}");
    let items = shown.items();
    assert_eq!(items.len(), 2, "{items:?}");
    assert_eq!(items[0].text(), "<chart>");
    assert!(matches!(
        items[0].get("image/png"),
        Some(DisplayData::Bytes(_))
    ));
    assert_eq!(items[1].text(), "'own'");
    assert!(!show_from_host(DisplayItem::new([])));
}
