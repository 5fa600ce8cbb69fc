#[cave_macros::function(crate = "cave_pytype")]
fn count(items: impl IntoIterator<Item = i64>) -> usize {
    items.into_iter().count()
}

fn main() {}
