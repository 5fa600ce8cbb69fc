#[derive(serde::Serialize, serde::Deserialize, cave_macros::PythonType)]
#[cave(crate = "cave_pytype")]
enum Shape {
    Circle { radius: f64 },
    Square,
}

fn main() {}
