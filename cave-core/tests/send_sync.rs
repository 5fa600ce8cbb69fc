//! Compile-time checks that public handles and futures can cross threads.

use cave_core::{
    Agent, AgentResponse, Event, EventStream, FenceParser, Message, ModelError, RuntimeError, Value,
};
use cave_testing::ScriptedModel;

fn send<T: Send>(_: &T) {}
fn send_sync<T: Send + Sync>() {}

#[test]
fn public_types_are_send_and_sync() {
    send_sync::<Agent>();
    send_sync::<AgentResponse>();
    send_sync::<Event>();
    send_sync::<Message>();
    send_sync::<Value>();
    send_sync::<ModelError>();
    send_sync::<RuntimeError>();
    send_sync::<FenceParser>();
    send_sync::<ScriptedModel>();
}

#[allow(dead_code, clippy::diverging_sub_expression)]
fn futures_are_send(agent: &mut Agent) {
    let stream: EventStream<'_> = agent.stream("x");
    send(&stream);
    drop(stream);
    send(&agent.run("x"));
}
