struct Lamp;

impl Lamp {
    #[cave_macros::function(crate = "cave_core")]
    pub fn toggle(&self) -> bool {
        true
    }
}

fn main() {}
