/*
 * sf_hf.h - Hugging Face style weights on the format seam, read-only:
 * what transformers' save_pretrained, ColossalAI's checkpoint IO and torch
 * DCP's HuggingFaceStorageWriter write.
 *
 * A directory is one of these when it holds, in the order transformers
 * itself looks for them (the first found is the checkpoint):
 *   1. model.safetensors                       one file, every tensor
 *   2. model.safetensors.index.json            + the shards its weight_map names
 *   3. pytorch_model.bin                       one torch.save archive
 *   4. pytorch_model.bin.index.json            + its .bin shards
 *   5. another *.safetensors.index*.json, then another *.bin.index*.json
 *      (first by name: diffusers' diffusion_pytorch_model...; transformers'
 *      variants model.safetensors.index.VARIANT.json)
 *   6. shard-RRRRR-model-XXXXX-of-YYYYY.safetensors, no index: DCP's
 *      HuggingFaceStorageWriter(save_distributed=True), one file per rank,
 *      each tensor's place in its global tensor in the file's
 *      __metadata__ DCP_SHARDING_INFO; the global shape is where the
 *      chunks end (as torch's own reader computes it).
 * Shards named PREFIX-XXXXX-of-YYYYY.EXT with no index, or an index whose
 * numbered shards are not all there, are a save still running (PARTIAL).
 *
 * Tensors are served in place from the files: a safetensors entry is a
 * contiguous box; a .bin tensor is its storage bytes from the view's
 * first element, with strides when it is not contiguous (storages may be
 * shared between tensors, as tied weights are). Every other regular file
 * (config.json, tokenizer files, unused weight files) is a root file; the
 * index and the weight files read are not.
 *
 * user.shardfs.format is "hf-safetensors" or "hf-bin", plus "dcp-V" when
 * the files carry DCP's DCP_VERSION V. No checksums: reads are unverified.
 */
#ifndef SF_HF_H
#define SF_HF_H

#include "sf_format.h"

#define SF_HF_FORMAT "hf"
#define SF_HF_FORMAT_ST "hf-safetensors"
#define SF_HF_FORMAT_BIN "hf-bin"

extern const struct sf_format sf_format_hf;

#endif
