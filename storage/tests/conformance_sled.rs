//! The storage conformance suite on the sled backend.

concord_storage::storage_conformance_tests!(concord_storage::BackendKind::Sled);
concord_storage::persistence_conformance_tests!(concord_storage::BackendKind::Sled);
