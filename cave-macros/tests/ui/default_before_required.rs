#[cave_macros::function(crate = "cave_pytype")]
fn greet(#[cave(default = 1)] times: u32, name: String) -> String {
    name.repeat(times as usize)
}

fn main() {}
