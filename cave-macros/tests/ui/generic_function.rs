#[cave_macros::function(crate = "cave_pytype")]
fn first<T: Clone>(items: Vec<T>) -> Option<T> {
    items.first().cloned()
}

fn main() {}
