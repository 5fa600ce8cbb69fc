struct Lamp {
    on: bool,
}

#[cave_macros::object(crate = "cave_core")]
impl Lamp {
    pub fn is_on(&self) -> bool {
        self.on
    }
}

fn main() {}
