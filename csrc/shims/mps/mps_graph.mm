// One plan = one MPSGraph, compiled once into an MPSGraphExecutable, bound per call.
//
// The graph reads every tensor as a 1-D range of its elements and makes the logical tensor
// itself (mps_problem.hpp): reshape + transpose for dense layouts, a gather for gapped ones.
// Then the convolution (2-D or 3-D MPSGraph op, in NCHW, or NHWC where macOS runs it
// natively), the epilogue in float32 (bias, activation, alpha, beta * old output), one
// rounding to the tensor's type, and the way back to the written range (transpose +
// reshape, or a scatter into the old range for gapped outputs).
#include "mps_graph.hpp"

#include <cmath>

namespace fdnn_mps {

using fdnn_shim::fail;

namespace {

MPSDataType mps_type(GraphDtype t) { return static_cast<MPSDataType>(static_cast<uint32_t>(t)); }

MPSShape* shape_of(const std::vector<int64_t>& dims) {
  NSMutableArray<NSNumber*>* shape = [NSMutableArray arrayWithCapacity:dims.size()];
  for (int64_t d : dims) [shape addObject:@(d)];
  return shape;
}

NSArray<NSNumber*>* permutation_of(const std::vector<int>& perm) {
  NSMutableArray<NSNumber*>* out = [NSMutableArray arrayWithCapacity:perm.size()];
  for (int d : perm) [out addObject:@(d)];
  return out;
}

MPSGraphTensorNamedDataLayout named_layout(GraphLayout layout) {
  return static_cast<MPSGraphTensorNamedDataLayout>(static_cast<int>(layout));
}

// Builds one plan's graph; every method adds ops to `graph`. (The ops it uses are macOS 13 at
// most: transposeTensor:permutation:; castTensor, leakyReLU and scatter are 12.)
class API_AVAILABLE(macos(13.0)) GraphBuilder {
 public:
  GraphBuilder(MpsPlan& plan) API_AVAILABLE(macos(13.0))
      : plan_(plan), p_(plan.problem), graph_([MPSGraph new]), dtype_(mps_type(p_.dtype)) {
    plan_.graph = graph_;
  }

  // The 1-D range placeholder of a role, remembered as a feed.
  MPSGraphTensor* feed(Role role, const TensorPlan& t) API_AVAILABLE(macos(13.0)) {
    MPSGraphTensor* range = [graph_ placeholderWithShape:@[ @(t.span) ] dataType:dtype_ name:nil];
    feeds_.push_back({range, role});
    shaped_[range] = [[MPSGraphShapedType alloc] initWithShape:@[ @(t.span) ] dataType:dtype_];
    return range;
  }

  void result(Role role, MPSGraphTensor* range) {
    results_.push_back({range, role});
  }

  // The logical tensor (shape t.shape) from its range.
  MPSGraphTensor* to_logical(MPSGraphTensor* range, const TensorPlan& t) API_AVAILABLE(macos(13.0)) {
    if (t.dense) {
      MPSGraphTensor* r = [graph_ reshapeTensor:range withShape:shape_of(t.memory_shape()) name:nil];
      if (t.is_identity_order()) return r;
      return [graph_ transposeTensor:r permutation:permutation_of(t.memory_to_logical()) name:nil];
    }
    MPSGraphTensor* flat = [graph_ gatherWithUpdatesTensor:range
                                             indicesTensor:indices(t)
                                                      axis:0
                                           batchDimensions:0
                                                      name:nil];
    return [graph_ reshapeTensor:flat withShape:shape_of(t.shape) name:nil];
  }

  // The written range from the logical result; `old_range` (the range as it was) keeps the
  // gaps of a gapped output.
  MPSGraphTensor* to_range(MPSGraphTensor* logical, const TensorPlan& t, MPSGraphTensor* old_range)
      API_AVAILABLE(macos(13.0)) {
    if (t.dense) {
      MPSGraphTensor* r = logical;
      if (!t.is_identity_order())
        r = [graph_ transposeTensor:r permutation:permutation_of(t.memory_order) name:nil];
      return [graph_ reshapeTensor:r withShape:@[ @(t.span) ] name:nil];
    }
    MPSGraphTensor* flat = [graph_ reshapeTensor:logical withShape:@[ @(t.count) ] name:nil];
    return [graph_ scatterWithDataTensor:old_range
                           updatesTensor:flat
                           indicesTensor:indices(t)
                                    axis:0
                                    mode:MPSGraphScatterModeSet
                                    name:nil];
  }

  // Logical N, C, *spatial -> the convolution's data layout, and back.
  MPSGraphTensor* to_conv_layout(MPSGraphTensor* logical) API_AVAILABLE(macos(13.0)) {
    if (p_.data_layout != GraphLayout::kNHWC) return logical;
    return [graph_ transposeTensor:logical permutation:@[ @0, @2, @3, @1 ] name:nil];
  }
  MPSGraphTensor* from_conv_layout(MPSGraphTensor* conv) API_AVAILABLE(macos(13.0)) {
    if (p_.data_layout != GraphLayout::kNHWC) return conv;
    return [graph_ transposeTensor:conv permutation:@[ @0, @3, @1, @2 ] name:nil];
  }
  MPSShape* conv_layout_shape(const TensorPlan& t) {
    const std::vector<int64_t>& s = t.shape;
    if (p_.data_layout != GraphLayout::kNHWC) return shape_of(s);
    return shape_of({s[0], s[2], s[3], s[1]});
  }

  // The type the convolution computes in, and the epilogue's float32.
  MPSGraphTensor* compute_input(MPSGraphTensor* t) {
    if (!p_.compute_in_float32) return t;
    return [graph_ castTensor:t toType:MPSDataTypeFloat32 name:@"compute_in_float32"];
  }
  MPSGraphTensor* f32(MPSGraphTensor* t) {
    if (t.dataType == MPSDataTypeFloat32) return t;
    return [graph_ castTensor:t toType:MPSDataTypeFloat32 name:@"epilogue_in_float32"];
  }
  // (castTensor's name is nonnull in Apple's header, unlike the other ops')
  MPSGraphTensor* rounded(MPSGraphTensor* t) {
    if (t.dataType == dtype_) return t;
    return [graph_ castTensor:t toType:dtype_ name:@"rounded_once"];
  }
  MPSGraphTensor* scalar(double v) {
    return [graph_ constantWithScalar:v dataType:MPSDataTypeFloat32];
  }
  MPSGraphTensor* mul(MPSGraphTensor* a, MPSGraphTensor* b) {
    return [graph_ multiplicationWithPrimaryTensor:a secondaryTensor:b name:nil];
  }
  MPSGraphTensor* add(MPSGraphTensor* a, MPSGraphTensor* b) {
    return [graph_ additionWithPrimaryTensor:a secondaryTensor:b name:nil];
  }

  // out = alpha * r (+ beta * old), in float32.
  MPSGraphTensor* scale_and_accumulate(MPSGraphTensor* r, MPSGraphTensor* old_logical) {
    if (p_.alpha != 1.f) r = mul(r, scalar(p_.alpha));
    return accumulate(r, old_logical);
  }
  MPSGraphTensor* accumulate(MPSGraphTensor* r, MPSGraphTensor* old_logical) {
    if (p_.beta == 0.f) return r;
    return add(r, mul(f32(old_logical), scalar(p_.beta)));
  }

  MPSGraphTensor* activation(MPSGraphTensor* v) API_AVAILABLE(macos(13.0));

  MPSGraphTensor* convolution(MPSGraphTensor* src, MPSGraphTensor* weights) API_AVAILABLE(macos(13.0));
  MPSGraphTensor* data_gradient(MPSGraphTensor* dy, MPSGraphTensor* weights) API_AVAILABLE(macos(13.0));
  MPSGraphTensor* weights_gradient(MPSGraphTensor* dy, MPSGraphTensor* src) API_AVAILABLE(macos(13.0));

  void build_forward() API_AVAILABLE(macos(13.0));
  void build_backward_data() API_AVAILABLE(macos(13.0));
  void build_backward_weight() API_AVAILABLE(macos(13.0));
  void compile() API_AVAILABLE(macos(13.0));

 private:
  MPSGraphTensor* indices(const TensorPlan& t) {
    NSData* data = [NSData dataWithBytes:t.gather_index.data()
                                  length:t.gather_index.size() * sizeof(int32_t)];
    return [graph_ constantWithData:data shape:@[ @(t.count) ] dataType:MPSDataTypeInt32];
  }
  MPSGraphConvolution2DOpDescriptor* descriptor_2d() API_AVAILABLE(macos(13.0));
  MPSGraphConvolution3DOpDescriptor* descriptor_3d() API_AVAILABLE(macos(13.2));

  MpsPlan& plan_;
  const ProblemPlan& p_;
  MPSGraph* graph_;
  MPSDataType dtype_;
  std::vector<GraphTensorRole> feeds_, results_;
  NSMutableDictionary<MPSGraphTensor*, MPSGraphShapedType*>* shaped_ =
      [NSMutableDictionary dictionary];
};

MPSGraphTensor* GraphBuilder::activation(MPSGraphTensor* v) {
  switch (p_.activation) {
    case FDNN_ACTIVATION_NONE:
      return v;
    case FDNN_ACTIVATION_RELU:
      return [graph_ reLUWithTensor:v name:nil];
    case FDNN_ACTIVATION_LEAKY_RELU:
      return [graph_ leakyReLUWithTensor:v alpha:p_.activation_alpha name:nil];
    case FDNN_ACTIVATION_CLIP:
      return [graph_ clampWithTensor:v
                      minValueTensor:scalar(p_.activation_alpha)
                      maxValueTensor:scalar(p_.activation_beta)
                                name:nil];
    case FDNN_ACTIVATION_SIGMOID:
      return [graph_ sigmoidWithTensor:v name:nil];
    case FDNN_ACTIVATION_TANH:
      return [graph_ tanhWithTensor:v name:nil];
    case FDNN_ACTIVATION_GELU_TANH: {  // 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
      MPSGraphTensor* cube = mul(mul(v, v), v);
      MPSGraphTensor* inner = mul(add(v, mul(cube, scalar(0.044715))), scalar(std::sqrt(2.0 / M_PI)));
      MPSGraphTensor* t = [graph_ tanhWithTensor:inner name:nil];
      return mul(mul(v, scalar(0.5)), add(t, scalar(1.0)));
    }
    case FDNN_ACTIVATION_GELU_ERF: {  // 0.5 v (1 + erf(v / sqrt 2))
      MPSGraphTensor* e = [graph_ erfWithTensor:mul(v, scalar(M_SQRT1_2)) name:nil];
      return mul(mul(v, scalar(0.5)), add(e, scalar(1.0)));
    }
    case FDNN_ACTIVATION_SILU:
      return mul(v, [graph_ sigmoidWithTensor:v name:nil]);
    default:
      fail(FDNN_ERROR_INTERNAL, "MPS shim: activation %d has no graph op", p_.activation);
  }
}

// Padding by side from the problem's per-dim lo/hi: graph dims are H, W (2-D) or D, H, W.
MPSGraphConvolution2DOpDescriptor* GraphBuilder::descriptor_2d() {
  MPSGraphConvolution2DOpDescriptor* d = [MPSGraphConvolution2DOpDescriptor new];
  d.strideInY = static_cast<NSUInteger>(p_.stride[0]);
  d.strideInX = static_cast<NSUInteger>(p_.stride[1]);
  d.dilationRateInY = static_cast<NSUInteger>(p_.dilation[0]);
  d.dilationRateInX = static_cast<NSUInteger>(p_.dilation[1]);
  d.paddingStyle = MPSGraphPaddingStyleExplicit;
  d.paddingTop = static_cast<NSUInteger>(p_.pad_lo[0]);
  d.paddingBottom = static_cast<NSUInteger>(p_.pad_hi[0]);
  d.paddingLeft = static_cast<NSUInteger>(p_.pad_lo[1]);
  d.paddingRight = static_cast<NSUInteger>(p_.pad_hi[1]);
  d.groups = static_cast<NSUInteger>(p_.groups);
  d.dataLayout = named_layout(p_.data_layout);
  d.weightsLayout = named_layout(p_.weights_layout);
  return d;
}

MPSGraphConvolution3DOpDescriptor* GraphBuilder::descriptor_3d() {
  MPSGraphConvolution3DOpDescriptor* d = [MPSGraphConvolution3DOpDescriptor new];
  d.strideInZ = static_cast<NSUInteger>(p_.stride[0]);
  d.strideInY = static_cast<NSUInteger>(p_.stride[1]);
  d.strideInX = static_cast<NSUInteger>(p_.stride[2]);
  d.dilationRateInZ = static_cast<NSUInteger>(p_.dilation[0]);
  d.dilationRateInY = static_cast<NSUInteger>(p_.dilation[1]);
  d.dilationRateInX = static_cast<NSUInteger>(p_.dilation[2]);
  d.paddingStyle = MPSGraphPaddingStyleExplicit;
  d.paddingFront = static_cast<NSUInteger>(p_.pad_lo[0]);
  d.paddingBack = static_cast<NSUInteger>(p_.pad_hi[0]);
  d.paddingTop = static_cast<NSUInteger>(p_.pad_lo[1]);
  d.paddingBottom = static_cast<NSUInteger>(p_.pad_hi[1]);
  d.paddingLeft = static_cast<NSUInteger>(p_.pad_lo[2]);
  d.paddingRight = static_cast<NSUInteger>(p_.pad_hi[2]);
  d.groups = static_cast<NSUInteger>(p_.groups);
  d.dataLayout = named_layout(p_.data_layout);
  d.weightsLayout = named_layout(p_.weights_layout);
  return d;
}

// The 3-D ops exist from macOS 13.2; plan_problem refuses rank 3 before (capabilities).
MPSGraphTensor* GraphBuilder::convolution(MPSGraphTensor* src, MPSGraphTensor* weights) {
  if (p_.graph_rank == 3) {
    if (@available(macOS 13.2, *))
      return [graph_ convolution3DWithSourceTensor:src
                                     weightsTensor:weights
                                        descriptor:descriptor_3d()
                                              name:nil];
    fail(FDNN_ERROR_UNSUPPORTED, "MPS shim: 3-D convolution needs macOS 13.2");
  }
  return [graph_ convolution2DWithSourceTensor:src weightsTensor:weights descriptor:descriptor_2d() name:nil];
}

MPSGraphTensor* GraphBuilder::data_gradient(MPSGraphTensor* dy, MPSGraphTensor* weights) {
  MPSShape* dx_shape = conv_layout_shape(p_.x);
  if (p_.graph_rank == 3) {
    if (@available(macOS 13.2, *))
      return [graph_ convolution3DDataGradientWithIncomingGradientTensor:dy
                                                           weightsTensor:weights
                                                             outputShape:dx_shape
                                            forwardConvolutionDescriptor:descriptor_3d()
                                                                    name:nil];
    fail(FDNN_ERROR_UNSUPPORTED, "MPS shim: 3-D convolution needs macOS 13.2");
  }
  return [graph_ convolution2DDataGradientWithIncomingGradientTensor:dy
                                                       weightsTensor:weights
                                                         outputShape:dx_shape
                                        forwardConvolutionDescriptor:descriptor_2d()
                                                                name:nil];
}

MPSGraphTensor* GraphBuilder::weights_gradient(MPSGraphTensor* dy, MPSGraphTensor* src) {
  MPSShape* w_shape = shape_of(p_.w.shape);  // OIHW / OIDHW: the logical weights
  if (p_.graph_rank == 3) {
    if (@available(macOS 13.2, *))
      return [graph_ convolution3DWeightsGradientWithIncomingGradientTensor:dy
                                                               sourceTensor:src
                                                                outputShape:w_shape
                                               forwardConvolutionDescriptor:descriptor_3d()
                                                                       name:nil];
    fail(FDNN_ERROR_UNSUPPORTED, "MPS shim: 3-D convolution needs macOS 13.2");
  }
  return [graph_ convolution2DWeightsGradientWithIncomingGradientTensor:dy
                                                           sourceTensor:src
                                                            outputShape:w_shape
                                           forwardConvolutionDescriptor:descriptor_2d()
                                                                   name:nil];
}

// y = alpha * act(conv(x, w) + bias) + beta * y: alpha scales the activated value
void GraphBuilder::build_forward() {
  MPSGraphTensor* x = compute_input(to_logical(feed(Role::kX, p_.x), p_.x));
  MPSGraphTensor* w = compute_input(to_logical(feed(Role::kW, p_.w), p_.w));
  MPSGraphTensor* r = f32(from_conv_layout(convolution(to_conv_layout(x), w)));
  if (p_.bias.present) {
    MPSGraphTensor* b = f32(to_logical(feed(Role::kBias, p_.bias), p_.bias));
    std::vector<int64_t> broadcast(p_.y.shape.size(), 1);
    broadcast[1] = p_.bias.shape[0];
    r = add(r, [graph_ reshapeTensor:b withShape:shape_of(broadcast) name:nil]);
  }
  r = activation(r);
  if (p_.alpha != 1.f) r = mul(r, scalar(p_.alpha));
  MPSGraphTensor* old_range = p_.reads_old(p_.y) ? feed(Role::kY, p_.y) : nil;
  if (old_range != nil) r = accumulate(r, to_logical(old_range, p_.y));
  result(Role::kY, to_range(rounded(r), p_.y, old_range));
}

// dx = alpha * conv_transpose(dy, w) + beta * dx
void GraphBuilder::build_backward_data() {
  MPSGraphTensor* dy = compute_input(to_logical(feed(Role::kY, p_.y), p_.y));
  MPSGraphTensor* w = compute_input(to_logical(feed(Role::kW, p_.w), p_.w));
  MPSGraphTensor* r = f32(from_conv_layout(data_gradient(to_conv_layout(dy), w)));
  MPSGraphTensor* old_range = p_.reads_old(p_.x) ? feed(Role::kX, p_.x) : nil;
  r = scale_and_accumulate(r, old_range != nil ? to_logical(old_range, p_.x) : nil);
  result(Role::kX, to_range(rounded(r), p_.x, old_range));
}

// dw = alpha * dconv/dw + beta * dw; db = alpha * sum(dy over N, spatial) + beta * db
void GraphBuilder::build_backward_weight() {
  MPSGraphTensor* dy_logical = to_logical(feed(Role::kY, p_.y), p_.y);
  MPSGraphTensor* x = compute_input(to_logical(feed(Role::kX, p_.x), p_.x));
  MPSGraphTensor* dy = compute_input(dy_logical);
  MPSGraphTensor* r = f32(weights_gradient(to_conv_layout(dy), to_conv_layout(x)));
  MPSGraphTensor* old_range = p_.reads_old(p_.w) ? feed(Role::kW, p_.w) : nil;
  r = scale_and_accumulate(r, old_range != nil ? to_logical(old_range, p_.w) : nil);
  result(Role::kW, to_range(rounded(r), p_.w, old_range));
  if (!p_.writes_bias_gradient()) return;
  NSMutableArray<NSNumber*>* axes = [NSMutableArray arrayWithObject:@0];
  for (size_t d = 2; d < p_.y.shape.size(); ++d) [axes addObject:@(d)];
  MPSGraphTensor* db = [graph_ reductionSumWithTensor:f32(dy_logical) axes:axes name:nil];
  db = [graph_ reshapeTensor:db withShape:@[ @(p_.bias.shape[0]) ] name:nil];
  MPSGraphTensor* old_bias = p_.reads_old(p_.bias) ? feed(Role::kBias, p_.bias) : nil;
  db = scale_and_accumulate(db, old_bias != nil ? to_logical(old_bias, p_.bias) : nil);
  result(Role::kBias, to_range(rounded(db), p_.bias, old_bias));
}

// Compiles for the feeds' shapes and records feeds and results in the executable's order.
void GraphBuilder::compile() {
  NSMutableArray<MPSGraphTensor*>* targets = [NSMutableArray array];
  for (const GraphTensorRole& r : results_) [targets addObject:r.tensor];
  MPSGraphDevice* device = [MPSGraphDevice deviceWithMTLDevice:metal_env().device];
  MPSGraphCompilationDescriptor* options = [MPSGraphCompilationDescriptor new];
  plan_.executable = [graph_ compileWithDevice:device
                                         feeds:shaped_
                                 targetTensors:targets
                              targetOperations:nil
                         compilationDescriptor:options];
  if (plan_.executable == nil)
    fail(FDNN_ERROR_VENDOR, "MPS shim: MPSGraph did not compile the %s graph", p_.name.c_str());
  auto in_order = [](NSArray<MPSGraphTensor*>* order, const std::vector<GraphTensorRole>& known) {
    std::vector<GraphTensorRole> out;
    for (MPSGraphTensor* t in order)  // (nil order: none found, refused below)
      for (const GraphTensorRole& k : known)
        if ([k.tensor isEqual:t]) out.push_back(k);
    if (out.size() != known.size())
      fail(FDNN_ERROR_INTERNAL, "MPS shim: the executable lists %zu of %zu graph tensors",
           out.size(), known.size());
    return out;
  };
  // (an executable takes its inputs and results as arrays in its own order)
  plan_.feeds = in_order(plan_.executable.feedTensors, feeds_);
  plan_.results = in_order(plan_.executable.targetTensors, results_);
}

// ------------------------------------------------------------------------------------------
// Execute

const TensorPlan& tensor_of(const ProblemPlan& p, Role role) {
  switch (role) {
    case Role::kX:
      return p.x;
    case Role::kW:
      return p.w;
    case Role::kY:
      return p.y;
    default:
      return p.bias;
  }
}

const char* role_name(Role role) {
  static const char* const names[] = {"x", "w", "y", "bias"};
  return names[static_cast<int>(role)];
}

// The plan's own MPSNDArray for a staged range, made on first need.
MPSNDArray* staging_array(MPSNDArray* __strong& slot, const TensorPlan& t, MPSDataType dtype) {
  if (slot == nil) {
    MPSNDArrayDescriptor* d = [MPSNDArrayDescriptor descriptorWithDataType:dtype shape:@[ @(t.span) ]];
    slot = [[MPSNDArray alloc] initWithDevice:metal_env().device descriptor:d];
    if (slot == nil)
      fail(FDNN_ERROR_OUT_OF_MEMORY, "MPS shim: no GPU memory for a %lld-element staging array",
           static_cast<long long>(t.span));
  }
  return slot;
}

// Binds one role's range: the caller's buffer from its start, a view at the offset (macOS
// 15+, never weights), or a copy through the plan's own array. Views and staged copies are
// MPSNDArrays, which MPS aborts on beyond 4 GiB: those ranges are refused first.
class API_AVAILABLE(macos(13.0)) Binder {
 public:
  Binder(MpsPlan& plan, const Buffers& buffers, MPSCommandBuffer* command_buffer)
      : plan_(plan), buffers_(buffers), cb_(command_buffer),
        dtype_(mps_type(plan.problem.dtype)) {}

  MPSGraphTensorData* input(Role role) {
    const TensorPlan& t = tensor_of(plan_.problem, role);
    const int i = static_cast<int>(role);
    id<MTLBuffer> buffer = checked_buffer(role, t);
    const uint64_t offset = buffers_.offset[i];
    const Binding binding = binding_for(offset, role == Role::kW, metal_env().os);
    check_ndarray_size(role_name(role), t, plan_.problem.element_size, binding);
    switch (binding) {
      case Binding::kDirect:
        return [[MPSGraphTensorData alloc] initWithMTLBuffer:buffer shape:@[ @(t.span) ] dataType:dtype_];
      case Binding::kView:
        if (@available(macOS 15.0, *)) return view(buffer, offset, t);
        [[fallthrough]];
      case Binding::kStaged:
        break;
    }
    MPSNDArray* staged = staging_array(plan_.staged_in[i], t, dtype_);
    [staged importDataWithCommandBuffer:cb_ fromBuffer:buffer sourceDataType:dtype_ offset:offset rowStrides:nil];
    return [[MPSGraphTensorData alloc] initWithMPSNDArray:staged];
  }

  // A written range; staged when the graph also reads it (beta, gaps), when it is dw at an
  // offset, or when the OS has no views (output_binding).
  MPSGraphTensorData* output(Role role) {
    const TensorPlan& t = tensor_of(plan_.problem, role);
    const int i = static_cast<int>(role);
    id<MTLBuffer> buffer = checked_buffer(role, t);
    const uint64_t offset = buffers_.offset[i];
    const Binding binding = output_binding(plan_.problem, t, offset, metal_env().os);
    check_ndarray_size(role_name(role), t, plan_.problem.element_size, binding);
    if (binding == Binding::kDirect)
      return [[MPSGraphTensorData alloc] initWithMTLBuffer:buffer shape:@[ @(t.span) ] dataType:dtype_];
    if (binding == Binding::kView)
      if (@available(macOS 15.0, *)) return view(buffer, offset, t);
    MPSNDArray* staged = staging_array(plan_.staged_out[i], t, dtype_);
    exports_.push_back({staged, buffer, offset});
    return [[MPSGraphTensorData alloc] initWithMPSNDArray:staged];
  }

  // Copies staged results to the caller's buffers, after the graph in the same command buffer.
  void encode_exports() {
    for (const Export& e : exports_)
      [e.array exportDataWithCommandBuffer:cb_ toBuffer:e.buffer destinationDataType:dtype_ offset:e.offset rowStrides:nil];
  }

 private:
  struct Export {
    MPSNDArray* array;
    id<MTLBuffer> buffer;
    uint64_t offset;
  };

  id<MTLBuffer> checked_buffer(Role role, const TensorPlan& t) {
    const int i = static_cast<int>(role);
    id<MTLBuffer> buffer = buffers_.buffer[i];
    if (buffer == nil)
      fail(FDNN_ERROR_INVALID_ARGUMENT, "Conv_Plan_Execute: %s is NULL", role_name(role));
    // A buffer of another GPU (a Mac with two) cannot feed this device's graph.
    if (buffer.device.registryID != metal_env().device.registryID)
      fail(FDNN_ERROR_INVALID_ARGUMENT, "Conv_Plan_Execute: %s's MTLBuffer belongs to another Metal device "
           "than the shim's (%s)", role_name(role), metal_env().device_name.c_str());
    const uint64_t end = buffers_.offset[i] + span_bytes(t, plan_.problem.element_size);
    if (end > buffer.length)
      fail(FDNN_ERROR_INVALID_ARGUMENT,
           "Conv_Plan_Execute: %s needs bytes up to %llu of its MTLBuffer, which has %llu",
           role_name(role), static_cast<unsigned long long>(end),
           static_cast<unsigned long long>(buffer.length));
    return buffer;
  }

  MPSGraphTensorData* view(id<MTLBuffer> buffer, uint64_t offset, const TensorPlan& t)
      API_AVAILABLE(macos(15.0)) {
    MPSNDArrayDescriptor* d = [MPSNDArrayDescriptor descriptorWithDataType:dtype_ shape:@[ @(t.span) ]];
    MPSNDArray* array = [[MPSNDArray alloc] initWithBuffer:buffer offset:offset descriptor:d];
    return [[MPSGraphTensorData alloc] initWithMPSNDArray:array];
  }

  MpsPlan& plan_;
  const Buffers& buffers_;
  MPSCommandBuffer* cb_;
  MPSDataType dtype_;
  std::vector<Export> exports_;
};

}  // namespace

void build_plan(MpsPlan& plan) {
  @autoreleasepool {
    GraphBuilder b(plan);
    switch (plan.problem.op) {
      case FDNN_CONV_FORWARD:
        b.build_forward();
        break;
      case FDNN_CONV_BACKWARD_DATA:
        b.build_backward_data();
        break;
      default:
        b.build_backward_weight();
        break;
    }
    b.compile();
    plan.algo_name = plan.problem.name;
  }
}

void run_plan(MpsPlan& plan, const Buffers& buffers, id<MTLCommandQueue> queue) {
  std::lock_guard<std::mutex> turn(plan.staging_mutex);
  @autoreleasepool {
    MPSCommandBuffer* cb = [MPSCommandBuffer commandBufferFromCommandQueue:queue];
    Binder bind(plan, buffers, cb);
    NSMutableArray<MPSGraphTensorData*>* inputs = [NSMutableArray arrayWithCapacity:plan.feeds.size()];
    for (const GraphTensorRole& f : plan.feeds) [inputs addObject:bind.input(f.role)];
    NSMutableArray<MPSGraphTensorData*>* results = [NSMutableArray arrayWithCapacity:plan.results.size()];
    for (const GraphTensorRole& r : plan.results) [results addObject:bind.output(r.role)];
    [plan.executable encodeToCommandBuffer:cb inputsArray:inputs resultsArray:results executionDescriptor:nil];
    bind.encode_exports();
    // DLPack carries no Metal stream: the caller's next use of the outputs is ordered by our
    // finishing, not by a queue, so the call returns when the GPU is done.
    [cb commit];
    [cb waitUntilCompleted];
    if (cb.status == MTLCommandBufferStatusError) {
      NSString* why = cb.error != nil ? cb.error.localizedDescription : @"no error description";
      fail(FDNN_ERROR_VENDOR, "MPS shim: the %s command buffer failed: %s", plan.problem.name.c_str(),
           why.UTF8String);
    }
  }
}

}  // namespace fdnn_mps
