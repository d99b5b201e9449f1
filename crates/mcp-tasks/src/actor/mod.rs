//! The actors: one task actor per live task, and the supervisor that spawns, rehydrates and
//! restarts them.
//!
//! Ordering rule for every transition (see ARCHITECTURE.md): compute the next record with
//! the pure [`crate::task::apply`], commit it to the store and wait for the durable ack, then
//! swap the actor's state, reply, and publish the snapshot. Nothing is observable before it
//! is committed.

mod subscriber;
mod supervisor;
mod task;

pub(crate) use subscriber::{OUTPUT_CAPACITY, Subscriber, SubscriberArgs};
pub(crate) use supervisor::{Supervisor, SupervisorMsg};
pub(crate) use task::{FencedStop, StoreFailure, TaskActor};
