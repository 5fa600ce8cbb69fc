struct Lamp {
    on: bool,
}

#[cave_macros::object(crate = "cave_pytype")]
impl Lamp {
    pub fn is_on(&self) -> bool {
        self.on
    }
}

fn main() {}
