#[cave_macros::object(crate = "cave_pytype")]
struct Lamp {
    on: bool,
}

#[cave_macros::object(crate = "cave_pytype")]
impl Lamp {
    pub fn into_state(self) -> bool {
        self.on
    }
}

fn main() {}
