//! The storage conformance suite on the sled backend.

concord_engine::storage_conformance_tests!(concord_engine::BackendKind::Sled);
concord_engine::persistence_conformance_tests!(concord_engine::BackendKind::Sled);
