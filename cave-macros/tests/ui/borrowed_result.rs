#[cave_macros::function(crate = "cave_pytype")]
fn name() -> &'static str {
    "cave"
}

fn main() {}
