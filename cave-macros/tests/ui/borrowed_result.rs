#[cave_macros::function(crate = "cave_core")]
fn name() -> &'static str {
    "cave"
}

fn main() {}
