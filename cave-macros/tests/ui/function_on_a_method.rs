struct Lamp;

impl Lamp {
    #[cave_macros::function(crate = "cave_pytype")]
    pub fn toggle(&self) -> bool {
        true
    }
}

fn main() {}
