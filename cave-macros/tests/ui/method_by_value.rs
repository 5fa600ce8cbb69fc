#[cave_macros::object(crate = "cave_core")]
struct Lamp {
    on: bool,
}

#[cave_macros::object(crate = "cave_core")]
impl Lamp {
    pub fn into_state(self) -> bool {
        self.on
    }
}

fn main() {}
