#[cave_macros::function(crate = "cave_core")]
fn shout(text: &str) -> String {
    text.to_uppercase()
}

fn main() {}
