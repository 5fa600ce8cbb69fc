#[derive(serde::Serialize, serde::Deserialize, cave_macros::PythonType)]
#[cave(crate = "cave_pytype")]
struct Order {
    #[serde(rename = "qty")]
    quantity: u32,
}

fn main() {}
