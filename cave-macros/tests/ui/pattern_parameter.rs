#[cave_macros::function(crate = "cave_pytype")]
fn add((a, b): (i64, i64)) -> i64 {
    a + b
}

fn main() {}
