//! Platform stand-ins: the places the filters are deployed, rebuilt
//! closely enough to run the examples on this machine. Envoy configured the
//! way Istio configures a sidecar ([`istio`]) on pods that are network
//! namespaces with Istio's capture ([`netns`]); the compose project
//! ([`compose`]) driven through a real Docker engine ([`docker`]); Envoy
//! Gateway's translation of its policies into Envoy config
//! ([`envoy_gateway`]).

pub mod compose;
pub mod docker;
pub mod envoy_gateway;
pub mod istio;
pub mod netns;
