//! The storage conformance suite on the mem backend.

concord_engine::storage_conformance_tests!(concord_engine::BackendKind::Memory);
