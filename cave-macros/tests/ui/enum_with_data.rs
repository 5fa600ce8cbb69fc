#[derive(serde::Serialize, serde::Deserialize, cave_macros::PythonType)]
#[cave(crate = "cave_core")]
enum Shape {
    Circle { radius: f64 },
    Square,
}

fn main() {}
