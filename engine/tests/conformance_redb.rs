//! The storage conformance suite on the redb backend.

concord_engine::storage_conformance_tests!(concord_engine::BackendKind::Redb);
concord_engine::persistence_conformance_tests!(concord_engine::BackendKind::Redb);
