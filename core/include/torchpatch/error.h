// Errors raised by torchpatch. Every message names the thing (key, file, tensor, plugin) and the cause.
#pragma once

#include "torchpatch/export.h"

#include <stdexcept>
#include <string>

namespace torchpatch {

/// Base of every error torchpatch throws on purpose.
class TORCHPATCH_API Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Misuse of the patch registry: duplicate key, unknown key, invalid regex, role mismatch.
class TORCHPATCH_API PatchError : public Error {
 public:
  using Error::Error;
};

/// A checkpoint or config that cannot be read: bad header, missing tensor, wrong shape.
class TORCHPATCH_API CheckpointError : public Error {
 public:
  using Error::Error;
};

/// A config.json that lacks a field or holds a value of the wrong kind.
class TORCHPATCH_API ConfigError : public Error {
 public:
  using Error::Error;
};

/// A plugin that cannot be loaded or registered.
class TORCHPATCH_API PluginError : public Error {
 public:
  using Error::Error;
};

/// Inputs that do not fit the model (shapes, token ids, masks).
class TORCHPATCH_API InputError : public Error {
 public:
  using Error::Error;
};

/// A device that this machine or this build does not have, or that a module cannot run on.
class TORCHPATCH_API DeviceError : public Error {
 public:
  using Error::Error;
};

}  // namespace torchpatch
