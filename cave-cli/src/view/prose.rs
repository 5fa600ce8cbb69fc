//! The model's prose as the page shows it: Markdown written as HTML here, on the server, with
//! pulldown-cmark, so that the page never parses anything a session holds. What the model
//! wrote as HTML is shown as text, links go only to the web or to mail, and images are links
//! (the page loads nothing from elsewhere).

use pulldown_cmark::{CowStr, Event, LinkType, Options, Parser, Tag, TagEnd};

/// The most prose rendered as Markdown; longer prose stays text (a model can write megabytes).
pub(crate) const MAX_MARKDOWN: usize = 256 << 10;

/// `markdown` as HTML safe to set in the page; `None` past [`MAX_MARKDOWN`].
pub(crate) fn to_html(markdown: &str) -> Option<String> {
    if markdown.len() > MAX_MARKDOWN {
        return None;
    }
    let options = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH;
    let events = Parser::new_ext(markdown, options).map(|event| match event {
        // Raw HTML is the model's text, shown as it wrote it.
        Event::Html(html) | Event::InlineHtml(html) => Event::Text(html),
        Event::Start(Tag::Link {
            link_type,
            dest_url,
            title,
            id,
        }) => Event::Start(Tag::Link {
            link_type,
            dest_url: safe_url(dest_url),
            title,
            id,
        }),
        // An image would be fetched from wherever the model said: a link to it instead, its
        // alt text the link's.
        Event::Start(Tag::Image {
            dest_url,
            title,
            id,
            ..
        }) => Event::Start(Tag::Link {
            link_type: LinkType::Inline,
            dest_url: safe_url(dest_url),
            title,
            id,
        }),
        Event::End(TagEnd::Image) => Event::End(TagEnd::Link),
        other => other,
    });
    let mut html = String::with_capacity(markdown.len() * 3 / 2);
    pulldown_cmark::html::push_html(&mut html, events);
    Some(html)
}

/// `url` when it goes to the web or to mail, else `#` (no `javascript:`, `data:`, or a path
/// on the viewer's own server).
fn safe_url(url: CowStr<'_>) -> CowStr<'_> {
    let lower = url.trim_start().to_ascii_lowercase();
    if ["http://", "https://", "mailto:"]
        .iter()
        .any(|scheme| lower.starts_with(scheme))
    {
        url
    } else {
        CowStr::Borrowed("#")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_becomes_html_and_html_stays_text() {
        let html = to_html("**June** sold best:\n\n| month | sales |\n|---|---|\n| June | 340 |\n")
            .unwrap();
        assert!(html.contains("<strong>June</strong>"), "{html}");
        assert!(html.contains("<td>340</td>"), "{html}");
        let html = to_html("<script>alert(1)</script> and <img src=x onerror=alert(1)>").unwrap();
        assert!(
            !html.contains("<script") && !html.contains("<img"),
            "{html}"
        );
        assert!(html.contains("&lt;script&gt;"), "{html}");
    }

    #[test]
    fn links_go_only_to_the_web_and_images_are_links() {
        let html = to_html("[a](javascript:alert(1)) [b](https://example.org/x) [c](data:text/html,x) [d](/events) ![chart](https://example.org/c.png)").unwrap();
        assert!(
            !html.contains("javascript:") && !html.contains("data:"),
            "{html}"
        );
        assert!(
            html.contains(r#"<a href="https://example.org/x">b</a>"#),
            "{html}"
        );
        assert!(html.contains(r##"<a href="#">d</a>"##), "{html}");
        assert!(
            html.contains(r#"<a href="https://example.org/c.png">chart</a>"#),
            "{html}"
        );
        assert!(!html.contains("<img"), "{html}");
    }

    #[test]
    fn too_much_prose_stays_text() {
        assert_eq!(to_html(&"x".repeat(MAX_MARKDOWN + 1)), None);
        // Deep nesting renders without recursion trouble.
        assert!(to_html(&"> ".repeat(5000)).is_some());
    }
}
