use cave_compact::{Encoding, RANGES, ScriptEstimator, TiktokenEstimator, estimator_for, rate};
use cave_core::TokenEstimator;

#[test]
fn the_reference_examples() {
    let e = ScriptEstimator;
    assert_eq!(e.estimate("hello world"), 2);
    assert_eq!(e.estimate(&"你好世界".repeat(10)), 50);
    assert_eq!(e.estimate(&format!("你好世界{}", "a".repeat(96))), 29);
    assert_eq!(e.estimate(""), 0);
    // The fast ASCII path and the per-character path agree.
    let text = "abcdefghij".repeat(7) + "é" + &"xyz".repeat(5);
    assert_eq!(ScriptEstimator::quarters(&text), 70 + 1 + 15);
}

#[test]
fn classes_are_disjoint_and_sorted() {
    for pair in RANGES.windows(2) {
        assert!(
            pair[0].1 < pair[1].0,
            "{:x?} overlaps {:x?}",
            pair[0],
            pair[1]
        );
    }
    for &(first, last, quarters) in RANGES {
        assert!(first <= last);
        assert_eq!((rate(first), rate(last)), (quarters, quarters));
    }
    assert_eq!(rate(0x00E9), 1, "Latin-1 letters are default");
    assert_eq!(rate(0x1FBFE), 1);
}

const SAMPLES: &[(&str, &str)] = &[
    (
        "Chinese",
        "机器学习是人工智能的一个分支，它使计算机能够从数据中学习并做出预测。",
    ),
    (
        "Japanese",
        "日本語のテキストはひらがなとカタカナと漢字で書かれています。",
    ),
    (
        "Korean",
        "한국어 문장은 한글로 쓰여 있으며 띄어쓰기를 사용합니다.",
    ),
    ("supplementary ideographs", "𠀀𠀁𠀂𪚥𪚦𫠝𠮷𡈽𤭢"),
    (
        "Cyrillic",
        "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    ),
    ("Greek", "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία και τα πάθη."),
    ("Hebrew", "דג סקרן שט בים מאוכזב ולפתע מצא חברה."),
    (
        "Arabic",
        "نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر.",
    ),
    ("Thai", "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน"),
    (
        "Devanagari",
        "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले",
    ),
    ("Bengali", "আমি বাংলায় গান গাই, আমি বাংলার গান গাই।"),
    ("Tamil", "யாமறிந்த மொழிகளிலே தமிழ்மொழி போல் இனிதாவது எங்கும் காணோம்"),
    (
        "Armenian",
        "Հայերենը հնդեվրոպական լեզվաընտանիքի անկախ ճյուղ է։",
    ),
    ("Georgian", "ქართული ენა ერთ-ერთი უძველესი ენაა მსოფლიოში."),
    ("Ethiopic", "ሰላም ለዓለም ሁሉ ይሁን።"),
    ("Cherokee", "ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ ᎠᏕᎶᏆᏍᏗ"),
    ("Myanmar", "မြန်မာဘာသာစကားသည် မြန်မာနိုင်ငံ၏ ရုံးသုံးဘာသာစကား ဖြစ်သည်။"),
    ("Tibetan", "བོད་ཀྱི་སྐད་ཡིག་ནི་བོད་མི་རྣམས་ཀྱི་སྐད་ཡིག་ཡིན།"),
    ("emoji", "😀😃😄😁😆😅😂🤣🥲☺️😊😇🙂🙃😉"),
    ("emoji ZWJ", "👨‍👩‍👧‍👦👩‍💻🧑‍🚀🏳️‍🌈👁️‍🗨️"),
    ("emoji symbols", "☀☁☂☃☄★☆☎☑☔☕♈♉♠♣♥♦✂✈✉"),
];

#[test]
fn the_heuristic_never_under_counts_and_at_most_triples() {
    let o200k = TiktokenEstimator::new(Encoding::O200k);
    let cl100k = TiktokenEstimator::new(Encoding::Cl100k);
    for (script, sample) in SAMPLES {
        let text = sample.repeat(4);
        let heuristic = ScriptEstimator.estimate(&text);
        let (a, b) = (o200k.estimate(&text), cl100k.estimate(&text));
        assert!(
            heuristic >= a && heuristic >= b,
            "{script}: heuristic {heuristic} < o200k {a} / cl100k {b}"
        );
        assert!(
            heuristic <= 3 * b,
            "{script}: heuristic {heuristic} > 3 × cl100k {b}"
        );
    }
}

#[test]
fn exact_counts_are_chosen_for_openai_models() {
    assert_eq!(
        TiktokenEstimator::new(Encoding::O200k).estimate("hello world"),
        2
    );
    assert!(TiktokenEstimator::for_model("gpt-4o-mini").is_some());
    assert!(TiktokenEstimator::for_model("openai/gpt-4.1").is_some());
    assert!(TiktokenEstimator::for_model("anthropic/claude-sonnet").is_none());
    // Unknown models get the heuristic.
    assert_eq!(estimator_for("llama-3").estimate(&"你好".repeat(4)), 10);
}
