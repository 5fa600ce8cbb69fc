#[cave_macros::function(crate = "cave_pytype")]
fn sum(values: &[i64]) -> i64 {
    values.iter().sum()
}

fn main() {}
