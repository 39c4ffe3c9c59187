//! The map index: where every logical page of every file lives (`index.rs`: chunks of the
//! index in RAM, their map nodes on flash), the groups that carry the namespace and the maps
//! into checkpoints (`groups.rs`), the rebuild of a lost map from the data nodes
//! (`rebuild.rs`), and the names they share (`keys.rs`). Its state is its own: the fields of
//! the index and the groups are seen in this folder only, and the rest of the file system
//! asks and tells them through their methods.

pub(crate) mod groups;
pub(crate) mod index;
pub(crate) mod keys;
pub(crate) mod paging;
mod rebuild;
mod shedding;
pub(crate) mod state_check;
