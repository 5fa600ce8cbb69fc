#[cave_macros::function(crate = "cave_pytype")]
fn shout(text: &str) -> String {
    text.to_uppercase()
}

fn main() {}
