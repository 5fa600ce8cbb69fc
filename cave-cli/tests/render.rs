//! The human rendering of a scripted run, colors off, against a snapshot.
//! `UPDATE_SNAPSHOTS=1` rewrites the snapshot after a deliberate change.

use cave_agent::{Event, Status, StopReason, Usage};
use cave_cli::output::{Human, Output, Retrieved};

fn transcript() -> Vec<Event> {
    vec![
        Event::UserPrompt {
            content: "Sort the scores.".into(),
            format_version: cave_agent::EVENT_FORMAT_VERSION,
        },
        Event::ThinkingChunk {
            content: "The scores".into(),
        },
        Event::ThinkingChunk {
            content: " are a list.".into(),
        },
        Event::Thinking {
            content: "The scores are a list.".into(),
            duration_ms: 1250,
        },
        Event::Text {
            content: "## Plan\nI will **sort** them with `sorted`:\n- first".into(),
        },
        Event::Text { content: " sort\n> a quoted **note**\n---\nSee [the docs](https://example.org/x) and `code`.\n1. first step\n".into() },
        Event::Text {
            content: "\n| region | sales |\n|:--|--:|\n| north | 1200 |\n| south-east | 80 |\n\n- fruit\n  - apples\n    - *green* ones\n  - pears\n- done\n".into(),
        },
        Event::Code {
            code: "report = \"\"\"\nTotal: {total}\n# not a comment\n\"\"\"\nprint(report.format(total=3))  # done".into(),
            unclosed: false,
            tool_call: None,
        },
        Event::Code {
            code: "scores = sorted(scores)\nprint(scores)".into(),
            unclosed: false,
            tool_call: None,
        },
        Event::ExecutionOutput {
            chunk: "[1, 2".into(),
        },
        Event::ExecutionOutput {
            chunk: ", 3]".into(),
        },
        Event::ExecutionOutput { chunk: "\n".into() },
        Event::SubAgent {
            agent: "cleaner".into(),
            event: Box::new(Event::UserPrompt {
                content: "Drop the missing values.".into(),
                format_version: cave_agent::EVENT_FORMAT_VERSION,
            }),
        },
        Event::SubAgent {
            agent: "cleaner".into(),
            event: Box::new(Event::Text {
                content: "I will filter.".into(),
            }),
        },
        Event::SubAgent {
            agent: "cleaner".into(),
            event: Box::new(Event::Code {
                code: "cleaned = [x for x in data if x]\nprint(len(cleaned))".into(),
                unclosed: false,
                tool_call: None,
            }),
        },
        Event::SubAgent {
            agent: "cleaner".into(),
            event: Box::new(Event::ExecutionResult {
                output: "4\n".into(),
                success: true,
                persisted: false,
                persisted_variable: None,
                state_lost: false,
            }),
        },
        Event::SubAgent {
            agent: "cleaner".into(),
            event: Box::new(Event::SubAgent {
                agent: "checker".into(),
                event: Box::new(Event::FinalResponse {
                    content: "Looks clean.".into(),
                }),
            }),
        },
        Event::SubAgent {
            agent: "cleaner".into(),
            event: Box::new(Event::FinalResponse {
                content: "Kept 4 values.".into(),
            }),
        },
        Event::SubAgent {
            agent: "cleaner".into(),
            event: Box::new(Event::Stopped {
                content: "Kept 4 values.".into(),
                stop_reason: StopReason::Completed,
                steps: 2,
                elapsed: 0.5,
                usage: Usage::new(10, 5),
                error: None,
                ledger: Default::default(),
            }),
        },
        Event::ExecutionResult {
            output: "[1, 2, 3]\n".into(),
            success: true,
            persisted: false,
            persisted_variable: None,
            state_lost: false,
        },
        Event::Backoff {
            delay: 1.5,
            reason: Some("HTTP 503: the server is\noverloaded".into()),
        },
        Event::Status(Status::OutputRecovery {
            recovery: 1,
            max_recoveries: 3,
        }),
        Event::Code {
            code: "print('x' * 9000)".into(),
            unclosed: false,
            tool_call: None,
        },
        Event::ExecutionResult {
            output: (1..=20).map(|i| format!("line {i}\n")).collect(),
            success: false,
            persisted: true,
            persisted_variable: Some("_output_1".into()),
            state_lost: false,
        },
        Event::ExecutionTimeout {
            timeout: 2.0,
            state_lost: true,
        },
        Event::Text {
            content: "Done: **[1, 2, 3]**.".into(),
        },
        Event::FinalResponse {
            content: "Done: **[1, 2, 3]**.".into(),
        },
        Event::Stopped {
            content: "Done.".into(),
            stop_reason: StopReason::Completed,
            steps: 3,
            elapsed: 2.345,
            usage: Usage::new(1200, 34).estimate(),
            error: None,
            ledger: Default::default(),
        },
    ]
}

#[test]
fn the_human_rendering_matches_its_snapshot() {
    let mut out = Vec::new();
    {
        let mut human = Human::new(&mut out, false);
        for event in transcript() {
            human.event(&event).unwrap();
        }
        human
            .retrieved(&Retrieved::Json {
                name: "scores".into(),
                value: serde_json::json!([1, 2, 3]),
            })
            .unwrap();
    }
    let rendered = String::from_utf8(out).unwrap();
    assert!(!rendered.contains('\x1b'), "no colors when they are off");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/snapshots/human.txt");
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(std::path::Path::new(path).parent().unwrap()).unwrap();
        std::fs::write(path, &rendered).unwrap();
    }
    let expected =
        std::fs::read_to_string(path).expect("the snapshot exists (UPDATE_SNAPSHOTS=1 writes it)");
    assert_eq!(rendered, expected);
}

#[test]
fn colors_are_used_on_a_terminal() {
    let mut out = Vec::new();
    Human::new(&mut out, true)
        .event(&Event::Code {
            code: "if x: return 'a'  # c".into(),
            unclosed: false,
            tool_call: None,
        })
        .unwrap();
    let rendered = String::from_utf8(out).unwrap();
    assert!(
        rendered.contains("\x1b[35mif\x1b[0m") && rendered.contains("\x1b[32m'a'\x1b[0m"),
        "{rendered:?}"
    );
}

#[test]
fn the_spinner_draws_while_waiting_and_is_erased_before_output() {
    let mut out = Vec::new();
    {
        let mut human = Human::new(&mut out, true);
        human
            .event(&Event::UserPrompt {
                content: "go".into(),
                format_version: cave_agent::EVENT_FORMAT_VERSION,
            })
            .unwrap();
        human.tick().unwrap();
        human
            .event(&Event::Code {
                code: "x = 1".into(),
                unclosed: false,
                tool_call: None,
            })
            .unwrap();
        human.tick().unwrap();
        human
            .event(&Event::FinalResponse {
                content: "done".into(),
            })
            .unwrap();
        human.tick().unwrap();
    }
    let rendered = String::from_utf8(out).unwrap();
    assert!(
        rendered.contains("thinking…") && rendered.contains("running…"),
        "{rendered:?}"
    );
    assert_eq!(
        rendered.matches("\r\x1b[K").count(),
        2,
        "each drawn frame is erased: {rendered:?}"
    );
    // Without colors (not a terminal), no spinner at all.
    let mut plain = Vec::new();
    let mut human = Human::new(&mut plain, false);
    human
        .event(&Event::UserPrompt {
            content: "go".into(),
            format_version: cave_agent::EVENT_FORMAT_VERSION,
        })
        .unwrap();
    human.tick().unwrap();
    assert!(!String::from_utf8(plain).unwrap().contains("thinking"));
}

/// Renders events without colors.
fn render(events: &[Event]) -> String {
    let mut out = Vec::new();
    {
        let mut human = Human::new(&mut out, false);
        for event in events {
            human.event(event).unwrap();
        }
    }
    String::from_utf8(out).unwrap()
}

#[test]
fn a_long_output_is_shown_once() {
    let lines: Vec<String> = (0..40).map(|i| format!("row {i:02}\n")).collect();
    let output = lines.concat();
    let mut events = vec![Event::Code {
        code: "for i in range(40): print(f'row {i:02}')".into(),
        unclosed: false,
        tool_call: None,
    }];
    events.extend(
        lines
            .iter()
            .map(|l| Event::ExecutionOutput { chunk: l.clone() }),
    );
    events.push(Event::ExecutionResult {
        output: output.clone(),
        success: true,
        persisted: false,
        persisted_variable: None,
        state_lost: false,
    });
    let rendered = render(&events);
    assert_eq!(rendered.matches("row 00").count(), 1, "{rendered}");
    assert_eq!(rendered.matches("row 39").count(), 0, "{rendered}");
    assert!(rendered.contains("… 28 more lines"), "{rendered}");

    // A failure shows the end, where the traceback is, once.
    let mut failing = events.clone();
    let traceback =
        "Traceback (most recent call last):\n  File \"<cell 1>\", line 1\nValueError: boom\n";
    failing.insert(
        failing.len() - 1,
        Event::ExecutionOutput {
            chunk: traceback.into(),
        },
    );
    failing.pop();
    failing.push(Event::ExecutionResult {
        output: format!("{output}{traceback}"),
        success: false,
        persisted: false,
        persisted_variable: None,
        state_lost: false,
    });
    let rendered = render(&failing);
    assert_eq!(rendered.matches("row 00").count(), 1, "{rendered}");
    assert_eq!(
        rendered.matches("ValueError: boom").count(),
        1,
        "{rendered}"
    );
    assert!(rendered.contains("(the code raised)"), "{rendered}");

    // One huge line is cut by characters, not shown whole.
    let huge = "x".repeat(50_000);
    let rendered = render(&[
        Event::Code {
            code: "print('x' * 50000)".into(),
            unclosed: false,
            tool_call: None,
        },
        Event::ExecutionOutput {
            chunk: huge.clone(),
        },
        Event::ExecutionResult {
            output: huge,
            success: true,
            persisted: false,
            persisted_variable: None,
            state_lost: false,
        },
    ]);
    assert!(rendered.len() < 5_000, "{} bytes", rendered.len());
    assert!(rendered.contains("more characters"), "{rendered}");
}

#[test]
fn a_multi_line_string_in_code_stays_a_string() {
    let mut out = Vec::new();
    {
        let mut human = Human::new(&mut out, true);
        human
            .event(&Event::Code {
                code: "s = \"\"\"\n# not a comment\n\"\"\"  # a comment".into(),
                unclosed: false,
                tool_call: None,
            })
            .unwrap();
    }
    let rendered = String::from_utf8(out).unwrap();
    let green = "\u{1b}[32m";
    let dim = "\u{1b}[2m";
    let inside = rendered
        .lines()
        .find(|l| l.contains("# not a comment"))
        .unwrap();
    assert!(
        inside.contains(green) && !inside.contains(dim),
        "inside the string: {inside:?}"
    );
    let last = rendered
        .lines()
        .find(|l| l.contains("# a comment"))
        .unwrap();
    assert!(
        last.contains(&format!("{dim}# a comment")),
        "a real comment: {last:?}"
    );
}

#[test]
fn a_sub_agents_events_are_nested_json_naming_it() {
    let mut lines = cave_cli::output::JsonLines::new(Vec::new());
    lines
        .event(&Event::SubAgent {
            agent: "analyzer".into(),
            event: Box::new(Event::Code {
                code: "print(1)".into(),
                unclosed: false,
                tool_call: None,
            }),
        })
        .unwrap();
    let text = String::from_utf8(lines.into_inner()).unwrap();
    let value: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
    assert_eq!(
        value,
        serde_json::json!({"type": "sub_agent", "agent": "analyzer", "event": {"type": "code", "code": "print(1)"}})
    );
    // And back: a reader of the stream gets the same event.
    let back: Event = serde_json::from_value(value).unwrap();
    assert!(
        matches!(back, Event::SubAgent { agent, event } if agent == "analyzer" && matches!(*event, Event::Code { .. }))
    );
}

/// What a cell shows: a line per rich form with its file, and the image drawn inline where
/// the terminal speaks an image protocol (never on a terminal that does not).
#[test]
fn shown_items_are_listed_and_drawn_where_the_terminal_can() {
    let png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x03\x00\x00\x00\x02".to_vec();
    let item = cave_agent::DisplayItem::new([
        (
            "text/html".to_owned(),
            cave_agent::DisplayData::Text("<table></table>".into()),
        ),
        ("image/png".to_owned(), cave_agent::DisplayData::Bytes(png)),
        (
            "text/plain".to_owned(),
            cave_agent::DisplayData::Text("<Figure>".into()),
        ),
    ]);
    let event = Event::Display {
        mime_types: item.mime_types().iter().map(|m| (*m).to_owned()).collect(),
        text: "<Figure>".into(),
        files: [("image/png".to_owned(), "out/display-1.png".to_owned())].into(),
        item: Some(Box::new(item)),
    };
    let draw = |protocol| {
        let mut out = Vec::new();
        {
            let mut human = Human::new(&mut out, false).with_images(protocol);
            human.event(&event).unwrap();
        }
        String::from_utf8(out).unwrap()
    };
    let plain = draw(None);
    assert_eq!(
        plain,
        "     ▣ text/html\n     ▣ image/png → out/display-1.png\n"
    );
    let kitty = draw(Some(cave_cli::images::ImageProtocol::Kitty));
    assert!(kitty.starts_with(&plain), "{kitty:?}");
    assert!(
        kitty[plain.len()..].starts_with("\x1b_Gf=100,a=T,c=60,m=0;iVBORw0KGgo"),
        "{kitty:?}"
    );
}
