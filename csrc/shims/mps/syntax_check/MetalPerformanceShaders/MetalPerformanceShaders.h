// FOR THE LINUX SYNTAX CHECK ONLY (.ci/mps.sh), never used in a real build: the
// MetalPerformanceShaders (MPSCore) interfaces the MPS shim uses, with the signatures, enum
// values, availability and nullability of Apple's headers. Where each comes from:
//   MPSCoreTypes.h: MPSDataType values (Float32 0x10000020, Float16 0x10000010, Int32
//     0x20000020, AlternateEncodingBit 0x80000000); BFloat16 = AlternateEncodingBit | Float16,
//     macOS 14.0 (Apple's documentation page mpsdatatype/bfloat16, mirrored in
//     Averyy/apple-dev-docs).
//   MPSNDArray.h (phracker/MacOSX-SDKs MacOSX12.0.sdk MPSCore.framework): MPSNDArray
//     (class macOS 10.15), -initWithDevice:descriptor: (nonnull instancetype, both arguments
//     _Nonnull), -exportDataWithCommandBuffer:toBuffer:destinationDataType:offset:rowStrides:
//     and -importDataWithCommandBuffer:fromBuffer:sourceDataType:offset:rowStrides: (command
//     buffer and buffer __nonnull, rowStrides __nullable, offset in bytes), the device
//     property; MPSNDArrayDescriptor +descriptorWithDataType:shape:.
//   -initWithBuffer:offset:descriptor: is public from macOS 15.0 (PyTorch declares it itself
//     before that, aten/src/ATen/native/mps/MPSGraphSequoiaOps.h).
//   MPSCommandBuffer.h: +commandBufferFromCommandQueue: (class macOS 10.15; not re-read for
//     issue 27, declared as the review read it).
#pragma once

#import <Metal/Metal.h>

NS_ASSUME_NONNULL_BEGIN

typedef enum : uint32_t {
  MPSDataTypeInvalid = 0,
  MPSDataTypeFloatBit = 0x10000000,
  MPSDataTypeFloat32 = MPSDataTypeFloatBit | 32,
  MPSDataTypeFloat16 = MPSDataTypeFloatBit | 16,
  MPSDataTypeSignedBit = 0x20000000,
  MPSDataTypeInt32 = MPSDataTypeSignedBit | 32,
  MPSDataTypeAlternateEncodingBit = 0x80000000,
  MPSDataTypeBFloat16 API_AVAILABLE(macos(14.0)) = MPSDataTypeAlternateEncodingBit | MPSDataTypeFloat16,
} MPSDataType;

typedef NSArray<NSNumber*> MPSShape;

API_AVAILABLE(macos(10.15))
@interface MPSCommandBuffer : NSObject <MTLCommandBuffer>
+ (MPSCommandBuffer*)commandBufferFromCommandQueue:(id<MTLCommandQueue>)commandQueue;
@end

API_AVAILABLE(macos(10.15))
@interface MPSNDArrayDescriptor : NSObject
+ (instancetype)descriptorWithDataType:(MPSDataType)dataType shape:(NSArray<NSNumber*>*)shape;
@end

API_AVAILABLE(macos(10.15))
@interface MPSNDArray : NSObject
@property(readonly, retain, nonatomic) id<MTLDevice> device;
- (instancetype)initWithDevice:(id<MTLDevice>)device descriptor:(MPSNDArrayDescriptor*)descriptor;
- (instancetype)initWithBuffer:(id<MTLBuffer>)buffer
                        offset:(NSUInteger)offset
                    descriptor:(MPSNDArrayDescriptor*)descriptor API_AVAILABLE(macos(15.0));
- (void)importDataWithCommandBuffer:(id<MTLCommandBuffer>)cmdBuf
                         fromBuffer:(id<MTLBuffer>)buffer
                     sourceDataType:(MPSDataType)sourceDataType
                             offset:(NSUInteger)offset
                         rowStrides:(NSInteger* _Nullable)rowStrides;
- (void)exportDataWithCommandBuffer:(id<MTLCommandBuffer>)cmdBuf
                           toBuffer:(id<MTLBuffer>)buffer
                destinationDataType:(MPSDataType)destinationDataType
                             offset:(NSUInteger)offset
                         rowStrides:(NSInteger* _Nullable)rowStrides;
@end

NS_ASSUME_NONNULL_END
