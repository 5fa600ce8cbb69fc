#[derive(serde::Serialize, serde::Deserialize, cave_macros::PythonType)]
#[cave(crate = "cave_pytype")]
struct Point(i64, i64);

fn main() {}
