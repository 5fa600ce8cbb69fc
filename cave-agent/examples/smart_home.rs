//! Stateful objects: a light and a thermostat are Rust structs the model operates through
//! their methods (`#[cave_agent::object]`); they never leave the host, which reads their new
//! state after the run.
//!
//! Offline: `cargo run -p cave-agent --example smart_home --features testing`. With
//! `LLM_MODEL_ID` set, a real model does it.

#[path = "common/mod.rs"]
mod common;

use cave_agent::Agent;
use cave_agent::AgentExt;
use cave_agent::testing::Reply;
use cave_agent::{InProcRuntime, Model, ObjectBinding, Resources, Runtime, Shared};
use std::sync::Arc;

/// A dimmable light.
#[cave_agent::object]
#[derive(Debug, Default)]
struct Light {
    /// Brightness, 0 (off) to 100.
    #[cave(get)]
    brightness: u8,
}

#[cave_agent::object]
impl Light {
    /// Sets the brightness (0 turns it off).
    ///
    /// # Arguments
    /// * `level` - 0 to 100
    pub fn dim(&mut self, level: i64) -> Result<u8, String> {
        let level = u8::try_from(level)
            .ok()
            .filter(|l| *l <= 100)
            .ok_or_else(|| format!("brightness {level} is outside 0..=100"))?;
        self.brightness = level;
        Ok(level)
    }
}

/// A thermostat with a schedule.
#[cave_agent::object]
#[derive(Debug)]
struct Thermostat {
    /// The temperature it aims for, in °C.
    #[cave(get)]
    target: f64,
    /// The night setback, when set: (hour, °C).
    #[cave(get)]
    night: Option<(u8, f64)>,
}

#[cave_agent::object]
impl Thermostat {
    /// Sets the target temperature.
    pub fn set_target(&mut self, celsius: f64) -> Result<f64, String> {
        if !(10.0..=28.0).contains(&celsius) {
            return Err(format!("{celsius} °C is outside 10..=28"));
        }
        self.target = celsius;
        Ok(celsius)
    }

    /// Lowers the temperature every night from `hour`.
    pub fn night_setback(&mut self, hour: u8, #[cave(default = 17.0)] celsius: f64) {
        self.night = Some((hour, celsius));
    }
}

fn script() -> Vec<Reply> {
    vec![
        common::code(
            "print(light.dim(30))\nprint(thermostat.set_target(21.5))\nthermostat.night_setback(22)\nprint(light.brightness, thermostat.target, thermostat.night)",
        ),
        Reply::text(
            "Dimmed the light to 30, set 21.5 °C, and a night setback to 17 °C from 22:00.",
        ),
    ]
}

/// Runs the request; returns what the host's objects hold afterwards.
async fn run(
    model: Arc<dyn Model>,
) -> Result<(u8, f64, Option<(u8, f64)>), Box<dyn std::error::Error>> {
    let light = Shared::new(Light::default());
    let thermostat = Shared::new(Thermostat {
        target: 20.0,
        night: None,
    });
    let runtime = InProcRuntime::new()?;
    runtime
        .register(
            Resources::new()
                .object(
                    ObjectBinding::new("light", light.clone())
                        .with_description("the living-room light"),
                )
                .object(
                    ObjectBinding::new("thermostat", thermostat.clone())
                        .with_description("the hall thermostat"),
                ),
        )
        .await?;
    let mut agent = Agent::builder(model, runtime).build()?;
    common::show(
        agent.stream("Make it cosy for the evening: dim the light to 30, 21.5 °C, and a night setback from 22:00."),
        true,
    )
    .await;
    let thermostat = thermostat.read().await;
    Ok((
        light.read().await.brightness,
        thermostat.target,
        thermostat.night,
    ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (brightness, target, night) = run(common::model(script)).await?;
    println!(
        "\nThe host reads: light at {brightness}, thermostat at {target} °C, night setback {night:?}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_host_objects_hold_what_the_model_did() {
        let model = Arc::new(cave_agent::testing::ScriptedModel::new(script()));
        assert_eq!(run(model).await.unwrap(), (30, 21.5, Some((22, 17.0))));
    }
}
